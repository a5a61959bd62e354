"""Pooling over a batch's real tokens; shared by every strategy that reads token states."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from ragidx.indexer.model.runtime import Batch
    from ragidx.indexer.strategies.base import PooledText


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``states`` [B, T, D] over the positions where ``mask`` [B, T] is non-zero (in float32)."""
    weights = mask.to(states.device).float()
    summed = (states.float() * weights.unsqueeze(-1)).sum(dim=1)
    return summed / weights.sum(dim=1, keepdim=True).clamp(min=1.0)


def last_real_token(states: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Each row's state at its last real token, whatever padding follows it."""
    import torch

    rows = torch.arange(states.shape[0], device=states.device)
    return states[rows, batch.last_positions.to(states.device)].float()


def mean_of_positions(states: torch.Tensor, batch: Batch, rows: Sequence[PooledText]) -> torch.Tensor:
    """Mean of each row's ``pooled`` positions only (a text's own tokens, not its template)."""
    import torch

    mask = torch.zeros_like(batch.attention_mask)
    for index, row in enumerate(rows):
        mask[index, row.pooled] = 1
    return masked_mean(states, mask)
