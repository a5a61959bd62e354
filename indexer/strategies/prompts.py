"""Prompt-based last-token strategies: the text is quoted inside a one-word summarisation prompt.

The templates are the authors' exact strings (methods.md §2); the readout is the final layer's
state (after the final norm) at the last token, the quote that opens the one-word answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import Templating
from ragidx.indexer.strategies.baselines import LastTokenPooling
from ragidx.indexer.strategies.options import StrategyOptions, option

if TYPE_CHECKING:
    pass

PROMPTEOL_TEMPLATE = 'This sentence : "{text}" means in one word:"'
COT_TEMPLATE = 'After thinking step by step , this sentence : "{text}" means in one word:"'
KNOWLEDGE_TEMPLATE = (
    "The essence of a sentence is often captured by its main subjects and actions, while descriptive "
    "terms provide additional but less central details. With this in mind , this sentence : "
    '"{text}" means in one word:"'
)
NORMAL_PROMPTS = {"prompteol": PROMPTEOL_TEMPLATE, "cot": COT_TEMPLATE, "knowledge": KNOWLEDGE_TEMPLATE}
DEMO_SEPARATOR = "=>"


def demonstration(icl_demo: str) -> str:
    """``"A jockey riding a horse.=>Equestrian"`` as the PromptEOL paper's one-shot prefix."""
    sentence, separator, word = icl_demo.rpartition(DEMO_SEPARATOR)
    if not separator or not sentence.strip() or not word.strip():
        raise RagidxError(
            f'--icl-demo {icl_demo!r}: use "SENTENCE=>WORD", e.g. "A jockey riding a horse.=>Equestrian"'
        )
    return f'This sentence : "{sentence.strip()}" means in one word:"{word.strip()}".'


class PromptEOL(LastTokenPooling):
    """PromptEOL (Jiang et al. 2023): the last token of the prompt must compress the text into one word."""

    name = "prompteol"
    description = 'last token of `This sentence : "{text}" means in one word:"` (short texts, STS)'
    paper = "Jiang et al. 2023, Scaling Sentence Embeddings with LLMs (PromptEOL)"
    default_document_template = PROMPTEOL_TEMPLATE
    default_query_template = PROMPTEOL_TEMPLATE
    preprocess_text = True

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        icl_demo: str | None = option('One demonstration, "SENTENCE=>WORD".')

    options: Options

    def templating(
        self, options: Options, document_template: str | None, query_template: str | None
    ) -> Templating:
        """``icl_demo`` prefixes one worked example (paper §3.2) to both templates, directly before
        them; a template that already starts with it (an index's stored one) keeps a single copy."""
        chosen = super().templating(options, document_template, query_template)
        prefix = demonstration(options.icl_demo) if options.icl_demo else ""

        def prefixed(template: str) -> str:
            return template if template.startswith(prefix) else prefix + template

        return chosen._replace(document=prefixed(chosen.document), query=prefixed(chosen.query))


class PretendedCoT(LastTokenPooling):
    name = "cot"
    description = "PromptEOL with the Pretended Chain-of-Thought prefix (short texts, STS)"
    paper = "Zhang et al. 2024, Simple Techniques for Enhancing Sentence Embeddings (Pretended CoT)"
    default_document_template = COT_TEMPLATE
    default_query_template = COT_TEMPLATE
    preprocess_text = True


class KnowledgePrompt(LastTokenPooling):
    name = "knowledge"
    description = "PromptEOL with the Knowledge Enhancement prefix (short texts, STS)"
    paper = "Zhang et al. 2024, Simple Techniques for Enhancing Sentence Embeddings (Knowledge)"
    default_document_template = KNOWLEDGE_TEMPLATE
    default_query_template = KNOWLEDGE_TEMPLATE
    preprocess_text = True
