"""Placeholder tokens for token prepending, added in memory only.

The user's model folder is never written: the tokens go into a private copy of the tokenizer and
their input-embedding rows are set on the loaded model. Rows are set from a fixed rule (the mean
row, or N(0,1) from a fixed seed) so a query embedded later gets exactly the build's rows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ragidx.indexer.errors import RagidxError

if TYPE_CHECKING:
    import torch

    from ragidx.indexer.model.runtime import ModelRuntime

SUMMARY_TOKEN = "<PST>"
BROADCAST_TOKEN = "<B-PST>"
PLACEHOLDER_INITS = ("mean", "randn")
RANDN_SEED = 0


@dataclass(frozen=True)
class Placeholders:
    """Ids of ``<PST>`` and ``<B-PST>``, their embedding rows, and what installing them did."""

    tokenizer: Any
    summary_id: int
    broadcast_id: int
    values: torch.Tensor
    rows_before: int
    rows_after: int

    def apply(self, model: Any) -> None:
        """Write this strategy's rows again: another strategy on the same model may have set others."""
        import torch

        weight = model.get_input_embeddings().weight
        with torch.no_grad():
            weight[[self.summary_id, self.broadcast_id]] = self.values.to(
                device=weight.device, dtype=weight.dtype
            )


def install_placeholders(runtime: ModelRuntime, init: str = "mean") -> Placeholders:
    """Add ``<PST>``/``<B-PST>`` to a copy of the tokenizer and set their embedding rows.

    The matrix grows only when the tokenizer outgrows it (Qwen checkpoints carry spare rows, which
    are then reused); ``mean`` is the mean of the rows of the tokens the tokenizer knows.
    Installing twice on one model gives the same ids and rows.
    """
    import torch

    if init not in PLACEHOLDER_INITS:
        raise RagidxError(f"unknown --placeholder-init '{init}': choose {' or '.join(PLACEHOLDER_INITS)}")
    tokenizer = copy.deepcopy(runtime.tokenizer)
    known = len(tokenizer)
    tokenizer.add_tokens([SUMMARY_TOKEN, BROADCAST_TOKEN], special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids([SUMMARY_TOKEN, BROADCAST_TOKEN])
    if min(ids) < known:
        raise RagidxError(
            f"the tokenizer of '{runtime.model_id}' already has {SUMMARY_TOKEN} or {BROADCAST_TOKEN}; "
            "token prepending needs them as fresh placeholders"
        )
    model = runtime.model
    rows_before = _embedding_rows(model).shape[0]
    if len(tokenizer) > rows_before:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    weight = _embedding_rows(model)
    with torch.no_grad():
        if init == "mean":
            values = weight[:known].float().mean(dim=0, keepdim=True).expand(len(ids), -1).clone()
        else:
            generator = torch.Generator().manual_seed(RANDN_SEED)
            values = torch.randn(len(ids), weight.shape[1], generator=generator)
    placeholders = Placeholders(tokenizer, ids[0], ids[1], values, rows_before, weight.shape[0])
    placeholders.apply(model)
    return placeholders


def _embedding_rows(model: Any) -> torch.Tensor:
    """The input embedding matrix (one row per token id)."""
    return cast("torch.Tensor", model.get_input_embeddings().weight)
