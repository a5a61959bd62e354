"""The interface every embedding strategy implements, and the templating they share."""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.batch_size import BatchSettings, device_batch
from ragidx.indexer.model.threads import on_idle_cores
from ragidx.indexer.roles import ROLES, Role
from ragidx.indexer.strategies.options import StrategyOptions
from ragidx.indexer.strategies.traced_readout import TracedReadout

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ragidx.indexer.ingest.spans import Span
    from ragidx.indexer.model.runtime import Batch, ModelRuntime

TEXT_SLOT = "{text}"
COMMON_PARAMS = frozenset({"document_template", "query_template", "max_length", "batch"})
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class PreparedText:
    """A text as the model will see it; strategies that need more than ids (placeholder
    positions, which tokens to pool) subclass it."""

    ids: list[int]


@dataclass(frozen=True)
class PooledText(PreparedText):
    """A prepared text whose readout averages a chosen set of positions (the text's own tokens)."""

    pooled: list[int]


def preprocess_for_prompt(text: str) -> str:
    """Normalise text the way the PromptEOL authors' code does before quoting it in a prompt.

    Strip; end with a sentence mark (append '.' unless it ends in . ? " '); turn double quotes
    into single ones so they cannot close the template's quote; a final '?' becomes '.'.
    """
    text = text.strip()
    if not text or text[-1] not in ".?\"'":
        text += "."
    text = text.replace('"', "'")
    if text.endswith("?"):
        text = text[:-1] + "."
    return text


def render(template: str, text: str) -> str:
    """Put ``text`` into the template's single ``{text}`` slot (no str.format: texts hold braces)."""
    return template.replace(TEXT_SLOT, text)


def check_template(template: str, what: str, slots: int = 1) -> str:
    if template.count(TEXT_SLOT) != slots:
        times = "once" if slots == 1 else f"{slots} times"
        raise RagidxError(f"{what} must contain {TEXT_SLOT} exactly {times}: {template!r}")
    return template


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class Templating(NamedTuple):
    """How a strategy puts text into its model (:meth:`Strategy.templating`)."""

    document: str
    query: str
    preprocess: bool  # cleaned for a one-word prompt first (see preprocess_for_prompt)


class Strategy(ABC):
    """Turns texts into L2-normalised float32 vectors with one model.

    Subclasses set the class attributes and implement :meth:`readout`; a strategy with options
    declares them in a nested ``Options`` dataclass (see :mod:`.options`) and keeps their resolved
    values in :attr:`options`. Everything that must be reproduced at query time is in
    :attr:`params`, which the index stores and passes back to :func:`create_strategy`.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    paper: ClassVar[str] = ""
    decoder_only: ClassVar[bool] = True
    default_document_template: ClassVar[str] = TEXT_SLOT
    default_query_template: ClassVar[str] = TEXT_SLOT
    preprocess_text: bool = False  # a class's setting, or an instance's where an option decides it
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    options: StrategyOptions
    default_max_length: ClassVar[int] = 512
    default_chunk_tokens: ClassVar[int] = 256
    text_slots: ClassVar[int] = 1
    # Whether ``readout`` of one row depends on its token ids alone (not on the prepared row's other
    # fields), so that it can be traced once and replayed for single texts (see traced_readout).
    traceable: ClassVar[bool] = False

    def __init__(
        self,
        runtime: ModelRuntime,
        options: StrategyOptions | None = None,
        *,
        document_template: str | None = None,
        query_template: str | None = None,
        max_length: int | None = None,
        batch: BatchSettings | None = None,
    ):
        if self.decoder_only and not runtime.arch.is_decoder:
            raise RagidxError(
                f"strategy '{self.name}' needs a decoder-only LLM, but '{runtime.model_id}' is a "
                f"{runtime.arch.model_type} encoder; use --strategy mean"
            )
        self.runtime = runtime
        self.options = options if options is not None else self.Options()
        chosen = self.templating(self.options, document_template, query_template)
        self.document_template = check_template(chosen.document, "document template", self.text_slots)
        self.query_template = check_template(chosen.query, "query template", self.text_slots)
        self.preprocess_text = chosen.preprocess
        self.max_length = min(max_length or self.default_max_length, runtime.max_positions)
        self.batch = batch or device_batch(runtime)
        self.truncated = 0
        self.one_row = TracedReadout(runtime, self._readout_of_ids) if self.traceable else None

    def templating(
        self, options: Any, document_template: str | None, query_template: str | None
    ) -> Templating:
        """The templates (those given, else the strategy's defaults) and whether text is cleaned
        for a one-word prompt; a strategy whose options decide them overrides this."""
        return Templating(
            document_template or self.default_document_template,
            query_template or self.default_query_template,
            self.preprocess_text,
        )

    @classmethod
    def takes(cls) -> frozenset[str]:
        """Every parameter this strategy accepts: the common ones and its own options."""
        return COMMON_PARAMS | cls.Options.names()

    @classmethod
    def upgrade_params(cls, stored: dict[str, Any]) -> dict[str, Any]:
        """Stored parameters of an index written by an older ragidx, with today's names and any
        parameter added since set to the behaviour that index was built with."""
        return stored

    @property
    def params(self) -> dict[str, Any]:
        """Everything that determines a vector, as stored in the index's meta table: the
        templates, the length and the resolved options."""
        return {
            "document_template": self.document_template,
            "query_template": self.query_template,
            "max_length": self.max_length,
            **self.resolved_options(),
        }

    def resolved_options(self) -> dict[str, Any]:
        """The options as stored: those given, with the values the strategy resolved (a layer set
        it chose, an exit layer counted from the end) in place of what was given; a strategy that
        resolves any keeps them in typed attributes of its own and overrides this."""
        return dataclasses.asdict(self.options)

    @property
    def notes(self) -> dict[str, Any]:
        """Facts worth recording that follow from the parameters (where a layer set came from...)."""
        return {}

    @property
    def dimension(self) -> int:
        return self.runtime.arch.hidden_size

    @staticmethod
    def check_role(role: str) -> Role:
        if role not in ROLES:
            raise RagidxError(f"unknown role '{role}': choose document or query")
        return role

    def template_for(self, role: Role) -> str:
        return self.document_template if self.check_role(role) == "document" else self.query_template

    def plain_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text alone, without special tokens (for assembling inputs by token)."""
        if not texts:
            return []
        return [
            list(ids) for ids in self.runtime.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        ]

    def token_ids(self, text: str, role: Role) -> list[int]:
        """Token ids of ``text`` in the role's template."""
        return self.templated_ids(text, self.template_for(role))

    def templated_ids(self, text: str, template: str) -> list[int]:
        """Token ids of ``text`` in ``template``; an over-long text is cut inside it, never the template."""
        if self.preprocess_text:
            text = preprocess_for_prompt(text)
        tokenizer = self.runtime.tokenizer
        ids = tokenizer(render(template, text))["input_ids"]
        if len(ids) <= self.max_length:
            return ids
        self.truncated += 1
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        keep = max(0, len(offsets) - (len(ids) - self.max_length))
        while True:
            cut = offsets[keep - 1][1] if keep > 0 else 0
            ids = tokenizer(render(template, text[:cut]))["input_ids"]
            if len(ids) <= self.max_length or keep == 0:
                return ids[: self.max_length]
            keep -= 1

    def prepare(
        self, texts: Sequence[str], role: Role, sentences: Sequence[Sequence[Span]] | None
    ) -> list[PreparedText]:
        """Token ids for each text; ``sentences`` (spans into each text) matter only to some strategies."""
        return [PreparedText(self.token_ids(text, role)) for text in texts]

    def encode(
        self,
        texts: Sequence[str],
        role: Role = "document",
        progress: ProgressCallback | None = None,
        sentences: Sequence[Sequence[Span]] | None = None,
    ) -> np.ndarray:
        """Vectors for ``texts`` in their order, float32 and L2-normalised, shape (n, dimension).

        ``sentences`` gives each text's sentence spans where the caller already has them (the
        chunker does); strategies that need sentences split the text themselves otherwise.
        """
        if sentences is not None and len(sentences) != len(texts):
            raise ValueError("sentences must have one entry per text")
        if any(not text.strip() for text in texts):  # builds never ask; a caller may
            raise RagidxError("cannot embed an empty text")
        prepared = self.prepare(texts, self.check_role(role), sentences)
        import numpy as np

        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        sequences = [row.ids for row in prepared]
        one_text = len(texts) == 1 and self.runtime.device.type == "cpu"  # a query, as a rule
        with self.runtime.in_use, on_idle_cores() if one_text else contextlib.nullcontext():
            for batch in self.runtime.batches(sequences, self.batch.max_rows, self.batch.max_tokens):
                out[batch.indices] = self._vectors(batch, prepared).float().cpu().numpy()
                if progress:
                    progress(len(batch.indices), int(batch.lengths.sum()))
        return l2_normalise(out)

    def _vectors(self, batch: Batch, prepared: Sequence[PreparedText]) -> torch.Tensor:
        """The batch's readout; where the device runs out of memory, its two halves' (and every
        later batch half as large): the GPU's batch is an estimate from free memory, which another
        process can take, and a long text's attention can outgrow."""
        import torch

        try:
            if self.one_row:
                return self.one_row(batch)
            return self.readout(batch, [prepared[i] for i in batch.indices])
        except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError from torch 2.5 on
            rows = len(batch.indices)
            if rows == 1:
                tokens = int(batch.lengths[0])
                raise RagidxError(
                    f"one text of {tokens} tokens does not fit in the memory {self.runtime.device} has "
                    "free; use --max-length to cut texts shorter, or free memory"
                ) from None
        if self.runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        half = rows // 2
        self.batch = BatchSettings(max(1, half), max(1, self.batch.max_tokens // 2))
        parts = [batch.indices[:half], batch.indices[half:]]
        halves = [self.runtime.pad([prepared[i].ids for i in part], part) for part in parts]
        return torch.cat([self._vectors(each, prepared) for each in halves])

    def _readout_of_ids(self, batch: Batch) -> torch.Tensor:
        """:meth:`readout` of a traceable strategy, which needs nothing of the rows but their ids."""
        return self.readout(batch, ())

    @abstractmethod
    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        """One un-normalised vector per row of the batch, shape (rows, dimension)."""
