"""Why a short query's forward has a floor: every weight is read once per forward.

Usage: python -m tests.benchmarks.weight_traffic [--model smollm2] [--dtype bfloat16] [--tokens 20]

Loads the model as ragidx does and times, on one row of ``--tokens`` random hidden states, the
linear layers of every decoder layer in turn (each weight streamed from memory, as in a forward)
against one layer's linear layers repeated as many times (its weights stay in cache). The first
is what a forward's products cost; the gap between them is the cost of weight traffic, and bytes
/ streaming time a lower bound of the memory bandwidth the forward sees. Then torch's 4-bit
weight-only product, which holds a Q4_1 GGUF's weights exactly (scale and minimum per 32
weights) in a quarter of bf16's bytes, is checked for exactness and timed against the dense
product on the same shape.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

GROUP = 32  # weights per scale and minimum in Q4_1 (and per sub-block in Q4_K)


def per_call_us(function: Callable[[], object], repeats: int) -> float:
    import torch

    with torch.inference_mode():
        for _ in range(max(3, repeats // 10)):
            function()
        started = time.perf_counter()
        for _ in range(repeats):
            function()
    return (time.perf_counter() - started) / repeats * 1e6


def int4_check(weight_shape: tuple[int, int], tokens: int, dtype: object) -> tuple[float, float, float]:
    """Max error in float32 (exactness), then µs per product for the 4-bit kernel and the dense one."""
    import torch

    out_features, in_features = weight_shape
    torch.manual_seed(0)
    levels = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
    groups = (out_features, in_features // GROUP)
    scale = (torch.rand(groups) * 0.01 + 0.001).half().float()
    minimum = (-torch.rand(groups) * 0.05).half().float()
    weight = (levels.view(*groups, GROUP).float() * scale[..., None] + minimum[..., None]).view(weight_shape)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1)
    # The kernel computes (level - 8) * scale + zero, so zero = minimum + 8 * scale.
    scales_zeros = torch.stack([scale, minimum + 8 * scale], dim=-1).transpose(0, 1).contiguous()
    rows = torch.randn(tokens, in_features)
    exact = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, GROUP, scales_zeros)
    error = float((exact - rows @ weight.T).abs().max())
    rows, scales_zeros = rows.to(dtype), scales_zeros.to(dtype)
    dense = torch.nn.Linear(in_features, out_features, bias=False).to(dtype)
    dense.weight.data = weight.to(dtype)
    four_bit = per_call_us(
        lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, GROUP, scales_zeros), 300
    )
    return error, four_bit, per_call_us(lambda: dense(rows), 300)


def main() -> None:
    import torch

    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.model.sources import resolve_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()
    runtime = load_runtime(resolve_model(args.model), "cpu", args.dtype)
    dtype = next(runtime.model.parameters()).dtype
    layers = runtime.arch.layers
    linears = [[m for m in layer.modules() if isinstance(m, torch.nn.Linear)] for layer in layers]
    hidden = runtime.arch.hidden_size
    inputs = {
        features: torch.randn(1, args.tokens, features, dtype=dtype)
        for features in {m.in_features for m in linears[0]}
    }
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for group in linears for m in group)

    def run(groups: list[list[torch.nn.Module]]) -> None:
        for group in groups:
            for module in group:
                module(inputs[module.in_features])

    streamed = per_call_us(lambda: run(linears), 30) / 1000
    cached = per_call_us(lambda: run([linears[len(linears) // 2]] * len(linears)), 30) / 1000
    bandwidth = weight_bytes / (streamed / 1000) / 1e9
    print(f"{args.model}, {dtype}, {len(layers)} layers, hidden {hidden}, {args.tokens} tokens, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print(f"linear weights read per forward: {weight_bytes / 1e6:.0f} MB")
    print(f"all layers' linears, each weight streamed: {streamed:.1f} ms ({bandwidth:.1f} GB/s seen)")
    print(f"one layer's linears {len(layers)} times, weights in cache: {cached:.1f} ms")
    gate = max(linears[0], key=lambda m: m.weight.numel())
    error, four_bit, dense = int4_check(tuple(gate.weight.shape), args.tokens, dtype)
    print(
        f"4-bit weight-only product {tuple(gate.weight.shape)}: max error {error:.1e} in float32 "
        f"(exact up to rounding); {four_bit:.0f} us vs dense {dense:.0f} us in {dtype}"
    )


if __name__ == "__main__":
    main()
