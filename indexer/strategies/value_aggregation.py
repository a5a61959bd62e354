"""Value Aggregation (Value Aggregation / AlignedWVA paper): vectors from attention values.

``va`` averages the value projections of every token; ``wva`` takes the last token's
attention-weighted values (the input of ``o_proj``); ``aligned-wva`` takes the same after
``o_proj``, i.e. the attention block's output before the residual add. Each is averaged over a
layer set S, and the forward pass stops after max(S).
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from ragidx.indexer.strategies.base import TEXT_SLOT, PreparedText, Strategy, Templating, render
from ragidx.indexer.strategies.layers import LAYERS_HELP, layer_set
from ragidx.indexer.strategies.options import QUERY_INSTRUCTION_HELP, StrategyOptions, option
from ragidx.indexer.strategies.paper_models import LLAMA2_7B, QWEN3_8B, LayerTable
from ragidx.indexer.strategies.pooling import last_real_token, masked_mean
from ragidx.indexer.strategies.prompts import PROMPTEOL_TEMPLATE

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ragidx.indexer.model.runtime import Batch, ModelRuntime

FUTUREEOL_TEMPLATE = "Forecasting the subsequent tokens {text} in one word:"
PROMPTS = {"futureeol": FUTUREEOL_TEMPLATE, "prompteol": PROMPTEOL_TEMPLATE, "none": TEXT_SLOT}
Prompt = Literal["futureeol", "prompteol", "none"]
PROMPT_HELP = "Prompt around the text."

# The paper's layer sets, recognised from the config so that renamed copies still match.
PAPER_LAYER_SETS: LayerTable = (
    ("Llama-2-7B", LLAMA2_7B, tuple(range(20, 28))),
    ("Qwen3-8B", QWEN3_8B, (26, 27, 29, 30, 31)),
)
RELATIVE_DEPTH = (0.65, 0.85)
# AlignedWVA on models the paper does not name reads on to the last layer: measured on SciFact
# train (500 abstracts, 200 claims) and STS-B train, 0.65-1.00 beat 0.65-0.85 on both real models
# (SmolLM2 nDCG@10 0.680 vs 0.563, Gemma 3 270M 0.520 vs 0.496); wva and va did not gain from it.
ALIGNED_RELATIVE_DEPTH = (0.65, 1.0)


class ValueAggregation(Strategy):
    """Shared machinery: prompt choice, layer set, one reading per layer, mean over layers."""

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        prompt: Prompt = option(PROMPT_HELP, "futureeol")
        layers: str | Sequence[int] | None = option(LAYERS_HELP)
        query_instruction: str | None = option(QUERY_INSTRUCTION_HELP)
        normalize_layers: bool = option("L2-normalise each layer before averaging.", False)

    options: Options
    reads_module_input: ClassVar[bool] = False
    traceable = True
    relative_depth: ClassVar[tuple[float, float]] = RELATIVE_DEPTH

    def __init__(self, runtime: ModelRuntime, options: Options | None = None, **common: Any):
        options = options or self.Options()
        super().__init__(runtime, options, **common)
        config, count = runtime.model.config, runtime.arch.num_layers
        self.layers, self.layer_source = layer_set(  # S
            options.layers, config, count, PAPER_LAYER_SETS, self.relative_depth
        )

    def templating(
        self, options: Options, document_template: str | None, query_template: str | None
    ) -> Templating:
        """The prompt's template for both roles (the query's with ``query_instruction`` before the
        text), its text cleaned for the one-word prompt; ``none``: the text alone."""
        template = PROMPTS[options.prompt]
        if options.query_instruction and not query_template:
            query_template = render(template, f"{options.query_instruction} {TEXT_SLOT}")
        return Templating(document_template or template, query_template or template, options.prompt != "none")

    def resolved_options(self) -> dict[str, Any]:
        return {**super().resolved_options(), "layers": self.layers}

    @property
    def notes(self) -> dict[str, Any]:
        return {"layer_source": self.layer_source, "exit_layer": max(self.layers)}

    @abstractmethod
    def module(self, layer: int) -> nn.Module:
        """The module whose output (or input) is read at ``layer``."""

    def reduce(self, states: torch.Tensor, batch: Batch) -> torch.Tensor:
        """One vector per row from the module's [batch, tokens, dim] tensor."""
        return last_real_token(states, batch)

    def layer_readings(self, batch: Batch, layers: Sequence[int]) -> torch.Tensor:
        """Each of ``layers``' reading of the batch from one forward pass, shape [layers, rows, dim]
        (the layer-set sweep of tests/benchmarks/layer_sweep.py reads them all at once)."""
        import torch

        with contextlib.ExitStack() as stack:
            readings = [
                stack.enter_context(
                    self.runtime.capture(
                        self.module(layer), lambda t: self.reduce(t, batch), inputs=self.reads_module_input
                    )
                )
                for layer in layers
            ]
            self.runtime.forward(batch, stop_after=max(layers))
        return torch.stack([reading[0] for reading in readings])

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        import torch

        per_layer = self.layer_readings(batch, self.layers)
        if self.options.normalize_layers:
            per_layer = torch.nn.functional.normalize(per_layer, dim=-1)
        return per_layer.mean(dim=0)


class ValueVectors(ValueAggregation):
    name = "va"
    description = "mean of every token's attention values (v_proj) over a layer set; prompt-free"
    paper = "Value Aggregation (VA), Value Aggregation / AlignedWVA paper"

    @dataclass(frozen=True)
    class Options(ValueAggregation.Options):
        prompt: Prompt = option(PROMPT_HELP, "none")

    @property
    def dimension(self) -> int:
        return self.runtime.arch.num_kv_heads * self.runtime.arch.head_dim

    def module(self, layer: int) -> nn.Module:
        return cast("nn.Module", self.runtime.arch.attention(layer).v_proj)

    def reduce(self, states: torch.Tensor, batch: Batch) -> torch.Tensor:
        return masked_mean(states, batch.attention_mask)


class WeightedValues(ValueAggregation):
    name = "wva"
    description = "last token's attention-weighted values (o_proj input) over a layer set, FutureEOL prompt"
    paper = "Weighted Value Aggregation (WVA), Value Aggregation / AlignedWVA paper"
    reads_module_input = True

    @property
    def dimension(self) -> int:
        return self.runtime.arch.num_heads * self.runtime.arch.head_dim

    def module(self, layer: int) -> nn.Module:
        return cast("nn.Module", self.runtime.arch.attention(layer).o_proj)


class AlignedWeightedValues(ValueAggregation):
    """The attention block's contribution to the residual stream at the last token.

    Where the architecture normalises the attention output before the residual add (Gemma 2 and
    3), ``attention_norm="after"`` (the default) reads it after that norm: what the residual
    stream receives, the "aligned" space of the paper. On Gemma 3 270M this scored SciFact nDCG@10
    0.50 vs 0.39 before the norm and STS-B 79.7 vs 74.6 (docs/choosing.md).
    """

    name = "aligned-wva"
    description = "last token's attention output (after o_proj) over a layer set, FutureEOL; short texts"
    paper = "AlignedWVA, Value Aggregation / AlignedWVA paper"
    relative_depth = ALIGNED_RELATIVE_DEPTH

    @dataclass(frozen=True)
    class Options(ValueAggregation.Options):
        attention_norm: Literal["after", "before"] = option(
            "Gemma: read the attention output after its post-attention norm (what the residual stream "
            "receives) or before it.",
            "after",
        )

    options: Options

    @classmethod
    def upgrade_params(cls, stored: dict[str, Any]) -> dict[str, Any]:
        """Indexes written before ``attention_norm`` existed read Gemma's output before its norm."""
        return {"attention_norm": "before", **stored}

    @property
    def notes(self) -> dict[str, Any]:
        if self.runtime.arch.attention_output_norm(0) is None:
            return super().notes
        side = self.options.attention_norm
        return {**super().notes, "readout": f"self_attn output {side} post_attention_layernorm"}

    def module(self, layer: int) -> nn.Module:
        norm = self.runtime.arch.attention_output_norm(layer)
        return (
            norm
            if norm is not None and self.options.attention_norm == "after"
            else self.runtime.arch.attention(layer)
        )
