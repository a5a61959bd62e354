"""Token Prepending (TP) and Hierarchical Token Prepending (HTP), methods.md §6.

Causal attention keeps early tokens from seeing later ones. Both strategies insert placeholder
tokens and, before each layer of an early window, overwrite their hidden states with summaries
of later text, so every token can attend to them. ``htp`` puts a ``<PST>`` before each block of
sentences (filled from the block's last token) and a ``<B-PST>`` per block at the front (filled
from that ``<PST>``); ``tp`` puts one ``<PST>`` before the text, filled from the last token. The
readout is an intermediate layer's output, and the forward pass stops there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.strategies.base import (
    ROLES,
    TEXT_SLOT,
    PooledText,
    PreparedText,
    Role,
    Strategy,
    Templating,
    preprocess_for_prompt,
)
from ragidx.indexer.strategies.layers import parse_window, resolve_layer
from ragidx.indexer.strategies.options import StrategyOptions, option
from ragidx.indexer.strategies.placeholders import install_placeholders
from ragidx.indexer.strategies.pooling import last_real_token, mean_of_positions
from ragidx.indexer.strategies.prompts import PROMPTEOL_TEMPLATE
from ragidx.indexer.strategies.token_templates import TokenTemplate, tokenize_template

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.ingest.spans import Span
    from ragidx.indexer.model.runtime import Batch, ModelRuntime

RETRIEVAL_QUERY_TEMPLATE = "Retrieve relevant document. Text:{text}"
PAPER_REWIRE_STOP = {32: 7}  # the HTP code's window for 32-layer models (Mistral-7B)
REWIRE_DEPTH = 0.22
Sink = Literal["auto", "bos", "eos", "none"]


def default_window(num_layers: int) -> tuple[tuple[int, int], str]:
    """Rewire before layers [1, stop): the authors' stop for 32 layers, else max(2, round(0.22·L))."""
    if num_layers in PAPER_REWIRE_STOP:
        return (1, PAPER_REWIRE_STOP[num_layers]), f"HTP code default for {num_layers}-layer models"
    stop = min(max(2, round(REWIRE_DEPTH * num_layers)), num_layers)
    return (min(1, stop), stop), f"1 to max(2, round({REWIRE_DEPTH}·L))"


def resolve_sink(tokenizer: Any, sink: Sink) -> Sink:
    """Which special token goes first when the tokenizer adds none itself.

    Position 0 is the attention sink; a placeholder there has its state overwritten in every
    rewired layer, which wrecks every later token (methods.md §6). ``auto`` is the declared BOS,
    else EOS; ``none`` where the tokenizer already starts every input with its own token.
    """
    if tokenize_template(tokenizer, TEXT_SLOT).lead:
        return "none"
    if sink == "auto":
        return "bos" if tokenizer.bos_token is not None else "eos"
    if sink != "none" and getattr(tokenizer, f"{sink}_token", None) is None:
        raise RagidxError(f"--sink {sink}: the tokenizer declares no {sink.upper()} token")
    return sink


@dataclass(frozen=True)
class PrependedText(PooledText):
    """Ids plus where the placeholders sit. ``summaries[j]`` is filled from ``sources[j]`` and then
    copied to ``broadcasts[j]`` (when there are broadcasts); ``pooled`` are the text's own tokens."""

    summaries: list[int]
    sources: list[int]
    broadcasts: list[int]


class Rewiring:
    """The copies of one batch as index tensors, applied by a forward pre-hook on a decoder layer."""

    def __init__(self, rows: Sequence[PrependedText], device: torch.device):
        import torch

        local: list[tuple[int, int, int]] = []  # (row, <PST> position, its source position)
        broadcast: list[tuple[int, int, int]] = []  # (row, <B-PST> position, its <PST> position)
        for index, row in enumerate(rows):
            local += [
                (index, summary, source) for summary, source in zip(row.summaries, row.sources, strict=True)
            ]
            broadcast += [
                (index, b, summary)
                for b, summary in zip(row.broadcasts, row.summaries, strict=bool(row.broadcasts))
            ]

        def columns(triples: list[tuple[int, int, int]]) -> list[torch.Tensor]:
            table = torch.tensor(triples, dtype=torch.long, device=device).reshape(-1, 3)
            return [table[:, 0], table[:, 1], table[:, 2]]

        self.rows, self.summaries, self.sources = columns(local)
        self.broadcast_rows, self.broadcasts, self.broadcast_summaries = columns(broadcast)

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0].clone()
        hidden[self.rows, self.summaries] = hidden[self.rows, self.sources]
        hidden[self.broadcast_rows, self.broadcasts] = hidden[self.broadcast_rows, self.broadcast_summaries]
        return (hidden, *args[1:])


class TokenPrepending(Strategy):
    """Shared machinery: placeholders, the rewiring window, the exit layer and the readout."""

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        rewire: str | Sequence[int] | None = option(
            "Rewire before layers START..STOP-1, e.g. 1-7 (1-1: none)."
        )
        exit_layer: int = option("Layer whose output is read; negative counts from the end.", -2)
        placeholder_init: Literal["mean", "randn"] = option("Embedding rows of <PST>/<B-PST>.", "mean")
        sink: Sink = option("Token put first when the tokenizer adds none; auto: its BOS, else EOS.", "auto")

    options: Options

    def __init__(self, runtime: ModelRuntime, options: Options | None = None, **common: Any):
        options = options or self.Options()
        super().__init__(runtime, options, **common)
        num_layers = runtime.arch.num_layers
        self.rewire: tuple[int, int]  # rewiring before layers rewire[0] .. rewire[1] - 1
        if options.rewire is None:
            self.rewire, self.window_source = default_window(num_layers)
        else:
            self.rewire, self.window_source = parse_window(options.rewire, num_layers), "--rewire"
        self.exit_layer = resolve_layer(options.exit_layer, num_layers, "--exit-layer")
        self.placeholders = install_placeholders(runtime, options.placeholder_init)
        self.sink: Sink = resolve_sink(runtime.tokenizer, options.sink)
        self.parts = {role: self._template(role) for role in ROLES}

    def resolved_options(self) -> dict[str, Any]:
        return {
            **super().resolved_options(),
            "rewire": list(self.rewire),
            "exit_layer": self.exit_layer,
            "sink": self.sink,
        }

    def _template(self, role: Role) -> TokenTemplate:
        """The role's template as ids, led by the sink token when the tokenizer puts none first."""
        parts = tokenize_template(self.runtime.tokenizer, self.template_for(role))
        if parts.lead or self.sink == "none":
            return parts
        tokenizer = self.runtime.tokenizer
        sink_id = tokenizer.convert_tokens_to_ids(getattr(tokenizer, f"{self.sink}_token"))
        return dataclasses.replace(parts, lead=[sink_id])

    @classmethod
    def upgrade_params(cls, stored: dict[str, Any]) -> dict[str, Any]:
        """Indexes written before ``sink`` existed put no sink token first."""
        return {"sink": "none", **stored}

    @property
    def notes(self) -> dict[str, Any]:
        placeholders = self.placeholders
        rows = (
            f"grown {placeholders.rows_before} -> {placeholders.rows_after}"
            if placeholders.rows_after > placeholders.rows_before
            else f"spare rows reused ({placeholders.rows_before} rows)"
        )
        return {
            "rewire_source": self.window_source,
            "exit_layer": self.exit_layer,
            "placeholder_ids": [placeholders.summary_id, placeholders.broadcast_id],
            "embedding_rows": rows,
        }

    def assemble(self, parts: TokenTemplate, blocks: Sequence[list[int]], broadcast: bool) -> PrependedText:
        """prefix + [B-PST]×M (if ``broadcast``) + per block ([PST] + block) + suffix."""
        ids = parts.lead + parts.prefix
        broadcasts = list(range(len(ids), len(ids) + len(blocks))) if broadcast else []
        ids += [self.placeholders.broadcast_id] * len(broadcasts)
        summaries: list[int] = []
        sources: list[int] = []
        pooled: list[int] = []
        for block in blocks:
            summaries.append(len(ids))
            ids.append(self.placeholders.summary_id)
            pooled.extend(range(len(ids), len(ids) + len(block)))
            ids += block
            sources.append(len(ids) - 1)
        ids += parts.suffix + parts.trail
        return PrependedText(ids, pooled, summaries, sources, broadcasts)

    def pool(self, states: torch.Tensor, batch: Batch, rows: Sequence[PrependedText]) -> torch.Tensor:
        """Mean over each text's own tokens: no template, no placeholders."""
        return mean_of_positions(states, batch, rows)

    def layer_readings(
        self, batch: Batch, rows: Sequence[PreparedText], exits: Sequence[int]
    ) -> list[torch.Tensor]:
        """The readout as if each of ``exits`` were the exit layer, from one forward pass (a layer
        never sees rewiring after it, so each equals its own early-exit run)."""
        prepended: list[PrependedText] = list(rows)  # type: ignore[arg-type]
        self.placeholders.apply(self.runtime.model)
        rewiring = Rewiring(prepended, batch.input_ids.device)
        start, stop = self.rewire
        layers = self.runtime.arch.layers
        with contextlib.ExitStack() as stack:
            for layer in range(start, min(stop, max(exits) + 1)):
                stack.callback(layers[layer].register_forward_pre_hook(rewiring).remove)
            readings = [
                stack.enter_context(
                    self.runtime.capture(layers[exit], lambda states: self.pool(states, batch, prepended))
                )
                for exit in exits
            ]
            self.runtime.forward(batch, stop_after=max(exits))
        return [reading[0] for reading in readings]

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        return self.layer_readings(batch, rows, [self.exit_layer])[0]


class HierarchicalTokenPrepending(TokenPrepending):
    name = "htp"
    description = "block summaries <PST>/<B-PST> rewired in early layers, mean of layer L-2; long documents"
    paper = "Hierarchical Token Prepending (HTP)"
    default_query_template = RETRIEVAL_QUERY_TEMPLATE
    default_max_length = 8192
    default_chunk_tokens = 1024

    @dataclass(frozen=True)
    class Options(TokenPrepending.Options):
        block_sentences: int = option("Sentences per block.", 1, minimum=1)

    options: Options

    @functools.cached_property
    def splitter(self) -> Chunker:
        return Chunker(self.runtime.tokenizer, self.max_length, overlap_sentences=0)

    def sentences(self, text: str) -> list[Span]:
        """Sentence spans for a text that comes without them (queries, ``ragidx embed``)."""
        return self.splitter.sentences(text)

    def prepare(
        self, texts: Sequence[str], role: Role, sentences: Sequence[Sequence[Span]] | None
    ) -> list[PreparedText]:
        parts = self.parts[role]
        prepared: list[PreparedText] = []
        for index, text in enumerate(texts):
            spans = list(sentences[index]) if sentences is not None else self.sentences(text)
            spans = [(start, end) for start, end in spans if text[start:end].strip()]
            if not spans:
                raise RagidxError(f"strategy '{self.name}' cannot embed an empty text")
            prepared.append(self.assemble(parts, self.fit_blocks(text, spans, parts), broadcast=True))
        return prepared

    def fit_blocks(self, text: str, spans: Sequence[Span], parts: TokenTemplate) -> list[list[int]]:
        """Token ids of the blocks of ``block_sentences`` sentences that fit ``max_length``.

        Whole trailing sentences are dropped so no placeholder loses its block; only a first
        sentence that alone is too long is cut. Each block costs its tokens plus two placeholders.
        """
        budget = self.max_length - parts.overhead
        if budget < 3:
            raise RagidxError(f"--max-length {self.max_length} leaves no room for text in the template")
        size = self.options.block_sentences
        groups = [spans[i : i + size] for i in range(0, len(spans), size)]
        blocks: list[list[int]] = []
        used = 0
        for group, ids in zip(
            groups, self.plain_ids([text[g[0][0] : g[-1][1]] for g in groups]), strict=True
        ):
            if used + len(ids) + 2 <= budget:
                blocks.append(ids)
                used += len(ids) + 2
                continue
            self.truncated += 1
            for keep in range(len(group) - 1, 0, -1):
                shorter = self.plain_ids([text[group[0][0] : group[keep - 1][1]]])[0]
                if used + len(shorter) + 2 <= budget:
                    blocks.append(shorter)
                    break
            if not blocks:
                blocks.append(ids[: budget - 2])
            break
        return blocks


class GlobalTokenPrepending(TokenPrepending):
    name = "tp"
    description = "one <PST> before the text, rewired from the last token in early layers; baseline of htp"
    paper = "Token Prepending (TP), Fu et al. 2024"
    default_query_template = RETRIEVAL_QUERY_TEMPLATE

    @dataclass(frozen=True)
    class Options(TokenPrepending.Options):
        pool: Literal["mean", "last"] = option("Readout pooling.", "mean")

    options: Options

    def templating(
        self, options: Options, document_template: str | None, query_template: str | None
    ) -> Templating:
        """Last-token TP is the TP paper's PromptEOL setting (cleaned text); mean pooling uses
        HTP's templates."""
        if options.pool == "mean":
            return super().templating(options, document_template, query_template)
        return Templating(document_template or PROMPTEOL_TEMPLATE, query_template or PROMPTEOL_TEMPLATE, True)

    def prepare(
        self, texts: Sequence[str], role: Role, sentences: Sequence[Sequence[Span]] | None
    ) -> list[PreparedText]:
        parts = self.parts[role]
        budget = self.max_length - parts.overhead - 1
        if budget < 1:
            raise RagidxError(f"--max-length {self.max_length} leaves no room for text in the template")
        if self.preprocess_text:
            texts = [preprocess_for_prompt(text) for text in texts]
        prepared: list[PreparedText] = []
        for ids in self.plain_ids(texts):
            if not ids and self.options.pool == "mean":
                raise RagidxError(f"strategy '{self.name}' with --pool mean cannot embed an empty text")
            if len(ids) > budget:
                self.truncated += 1
            row = self.assemble(parts, [ids[:budget]], broadcast=False)
            prepared.append(dataclasses.replace(row, sources=[len(row.ids) - 1]))  # from the last token
        return prepared

    def pool(self, states: torch.Tensor, batch: Batch, rows: Sequence[PrependedText]) -> torch.Tensor:
        return (
            last_real_token(states, batch)
            if self.options.pool == "last"
            else super().pool(states, batch, rows)
        )
