"""KV-Embedding (Tang & Yang 2025, methods.md §5): the last token's keys and values as a global prefix.

At each layer of a set S, every query also attends to the last real token's key/value (per KV
head, after RoPE), with a bias b on that column, so early tokens see a summary of the whole text
in one forward pass. The vector is ½·(last token + mean over tokens) of the final layer, post-norm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import PreparedText, Strategy
from ragidx.indexer.strategies.kv_rerouting import reroute
from ragidx.indexer.strategies.layer_calibration import calibrated_layers
from ragidx.indexer.strategies.layers import LAYERS_HELP, layer_set
from ragidx.indexer.strategies.options import StrategyOptions, option
from ragidx.indexer.strategies.paper_models import (
    LLAMA31_8B,
    MISTRAL_7B_V01,
    QWEN3_4B,
    LayerTable,
)
from ragidx.indexer.strategies.pooling import last_real_token, masked_mean

if TYPE_CHECKING:
    import torch

    from ragidx.indexer.model.runtime import Batch, ModelRuntime

KV_DOCUMENT_TEMPLATE = "Context: {text} Compress the Context in one word:"
KV_QUERY_TEMPLATE = "Query: {text} Compress the Query in one word:"
DEFAULT_BIAS = 1.0
PAPER_LAYER_SETS: LayerTable = (
    ("Qwen3-4B", QWEN3_4B, tuple(range(12, 22))),
    ("Mistral-7B-Instruct-v0.1", MISTRAL_7B_V01, tuple(range(13, 20))),
    ("Llama-3.1-8B", LLAMA31_8B, (10, 11, 20, 26, 27, 28, 29, 30, 31)),
)
FALLBACK_DEPTH = (0.35, 0.6)


class KVEmbedding(Strategy):
    name = "kv-embedding"
    description = "last token's keys/values re-routed as a prefix at mid layers; ½(last + mean) of the output"
    paper = "Tang & Yang 2025, KV-Embedding: training-free text embedding via internal KV re-routing"
    default_document_template = KV_DOCUMENT_TEMPLATE
    default_query_template = KV_QUERY_TEMPLATE
    traceable = True

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        layers: str | Sequence[int] | None = option(LAYERS_HELP)
        kv_bias: float = option("Logit bias of the re-routed prefix; -inf: no re-routing.", DEFAULT_BIAS)

    options: Options

    def __init__(self, runtime: ModelRuntime, options: Options | None = None, **common: Any):
        options = options or self.Options()
        super().__init__(runtime, options, **common)
        if math.isnan(options.kv_bias) or options.kv_bias == math.inf:
            raise RagidxError(f"--kv-bias must be a number or -inf (no re-routing), got {options.kv_bias}")
        # S: calibration is not run on its own: on neither packaged model did it beat the fallback
        # depth band on both STS and retrieval (docs/strategies.md, "KV-Embedding and `ragidx calibrate`").
        self.layers, self.layer_source = layer_set(
            options.layers,
            runtime.model.config,
            runtime.arch.num_layers,
            PAPER_LAYER_SETS,
            FALLBACK_DEPTH,
            lambda: calibrated_layers(runtime),
            "fallback depth {low:.2f}-{high:.2f} (no calibration cached)",
        )

    def resolved_options(self) -> dict[str, Any]:
        return {**super().resolved_options(), "layers": self.layers}

    @property
    def notes(self) -> dict[str, Any]:
        return {"layer_source": self.layer_source}

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        with reroute(self.runtime, self.layers, self.options.kv_bias, batch.last_positions):
            states = self.runtime.forward(batch)
        return 0.5 * (last_real_token(states, batch) + masked_mean(states, batch.attention_mask))
