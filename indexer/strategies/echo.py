"""Echo embeddings (Springer et al.), methods.md §1: the text twice, mean over the second copy.

Tokens of the second copy have attended to the whole first copy, so they carry what comes later
in the text despite causal attention; the price is a sequence twice as long.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.roles import ROLES, Role
from ragidx.indexer.strategies.base import PooledText, PreparedText, Strategy, Templating
from ragidx.indexer.strategies.options import QUERY_INSTRUCTION_HELP, StrategyOptions, option
from ragidx.indexer.strategies.pooling import mean_of_positions
from ragidx.indexer.strategies.token_templates import tokenize_template

if TYPE_CHECKING:
    import torch

    from ragidx.indexer.ingest.spans import Span
    from ragidx.indexer.model.runtime import Batch, ModelRuntime

ECHO_DOCUMENT_TEMPLATE = "Document:{text}\nDocument again:{text}"
ECHO_QUERY_TEMPLATE = "Instruct: {instruction}\nQuery:{text}\nQuery again:{text}"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
INSTRUCTION_SLOT = "{instruction}"


class Echo(Strategy):
    name = "echo"
    description = "text written twice; mean of the final layer over the second copy (2x the tokens)"
    paper = "Springer et al. 2024, Repetition Improves Language Model Embeddings (echo)"
    default_document_template = ECHO_DOCUMENT_TEMPLATE
    default_query_template = ECHO_QUERY_TEMPLATE
    default_max_length = 1024  # two copies of a 256-token chunk and the template fit
    text_slots = 2

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        query_instruction: str | None = option(QUERY_INSTRUCTION_HELP)

    options: Options

    def __init__(self, runtime: ModelRuntime, options: Options | None = None, **common: Any):
        given = options or self.Options()
        instruction = given.query_instruction or DEFAULT_INSTRUCTION
        super().__init__(runtime, dataclasses.replace(given, query_instruction=instruction), **common)
        self.token_templates = {
            role: tokenize_template(runtime.tokenizer, self.template_for(role)) for role in ROLES
        }

    def templating(
        self, options: Options, document_template: str | None, query_template: str | None
    ) -> Templating:
        """The query template with the instruction in its slot."""
        chosen = super().templating(options, document_template, query_template)
        return chosen._replace(query=chosen.query.replace(INSTRUCTION_SLOT, options.query_instruction or ""))

    def prepare(
        self, texts: Sequence[str], role: Role, sentences: Sequence[Sequence[Span]] | None
    ) -> list[PreparedText]:
        template = self.token_templates[role]
        room = (self.max_length - template.overhead) // 2
        if room < 1:
            raise RagidxError(f"--max-length {self.max_length} leaves no room for two copies of the text")
        eos = self.runtime.tokenizer.eos_token_id
        prepared: list[PreparedText] = []
        for ids in self.plain_ids(texts):
            if len(ids) > room:
                self.truncated += 1
                ids = ids[:room]
            first, middle, last = template.pieces
            second = len(template.lead) + len(first) + len(ids) + len(middle)
            sequence = template.lead + first + ids + middle + ids + last + template.trail
            trailing_eos = [
                second + len(ids) + len(last) + i for i, t in enumerate(template.trail) if t == eos
            ]
            prepared.append(PooledText(sequence, list(range(second, second + len(ids))) + trailing_eos))
        return prepared

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        return mean_of_positions(self.runtime.forward(batch), batch, rows)  # type: ignore[arg-type]
