"""Plain pooling baselines over the final layer: the reference every method is measured against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ragidx.indexer.strategies.base import PreparedText, Strategy
from ragidx.indexer.strategies.pooling import last_real_token, masked_mean

if TYPE_CHECKING:
    import torch

    from ragidx.indexer.model.runtime import Batch


class MeanPooling(Strategy):
    """Masked mean of the final layer (after the final norm) over every real token."""

    name = "mean"
    description = "mean of the final layer over all tokens; works for decoders and BERT-style encoders"
    paper = "baseline (sentence-transformers mean pooling)"
    decoder_only = False
    traceable = True

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        return masked_mean(self.runtime.forward(batch), batch.attention_mask)


class LastTokenPooling(Strategy):
    """The final layer's state at the last real token, which has attended to the whole text."""

    name = "last"
    description = "final-layer state of the last token (causal models only)"
    paper = "baseline"
    traceable = True

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        return last_real_token(self.runtime.forward(batch), batch)


class FirstTokenPooling(Strategy):
    """The final layer's state at the first token, [CLS]: how BGE and other encoders trained with
    CLS pooling are read (their sentence-transformers files say so)."""

    name = "cls"
    description = "final-layer state of the first token, [CLS] (encoders trained with CLS pooling)"
    paper = "baseline (sentence-transformers CLS pooling)"
    decoder_only = False
    traceable = True

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        return self.runtime.forward(batch)[:, 0].float()
