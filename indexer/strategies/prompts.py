"""Prompt-based last-token strategies: the text is quoted inside a one-word summarisation prompt."""

from __future__ import annotations

from ragidx.indexer.strategies.baselines import LastTokenPooling

PROMPTEOL_TEMPLATE = 'This sentence : "{text}" means in one word:"'


class PromptEOL(LastTokenPooling):
    """PromptEOL (Jiang et al. 2023): the last token of the prompt must compress the text into one word."""

    name = "prompteol"
    description = 'last token of `This sentence : "{text}" means in one word:"` (short texts, STS)'
    paper = "Jiang et al. 2023, Scaling Sentence Embeddings with LLMs (PromptEOL)"
    default_document_template = PROMPTEOL_TEMPLATE
    default_query_template = PROMPTEOL_TEMPLATE
    preprocess_text = True
