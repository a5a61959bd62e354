"""How far int8 x int8 products (W8A8) would move a real decoder's vectors, before any kernel is
written: each scheme simulated in float32 (quantise, dequantise, multiply) over every linear layer.

Usage: python -m tests.benchmarks.int8_products [--model smollm2] [--strategies mean,aligned-wva]
       [--sts ../shared/eval/stsb/sts-dev.csv] --scheme SCHEME [--scheme SCHEME ...]

A scheme is comma-separated ``key=value``: ``group`` (activations and weights share one symmetric
int8 scale per this many inputs; 0: a scale per token and per weight row, what fbgemm's product
takes), ``alpha`` (SmoothQuant's migration strength; per-input scales from the largest activations
seen on eight sample-corpus passages; absent: none), ``float`` (layers whose name contains any of
these ``+``-separated words keep float32 products, e.g. ``down_proj``), ``threshold`` (a layer
whose own output, rounded, is further than this from its float32 output, relative to its norm,
on the calibration passages, keeps float32 products: the per-layer choice), ``weights=0`` or
``activations=0`` (leave that side unrounded). Printed first: each kind of layer's relative
errors. The texts are the first 24 STS-B dev pairs' 48
sentences and 8 sample-corpus passages of 200 words; printed per strategy: the smallest and mean
cosine to float32. Weights are those the GGUF cache holds, in float32 and unpacked.
"""

from __future__ import annotations

import argparse
import csv
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tests.benchmarks.llama_cpp_anchor import gguf_path, passages


@dataclass(frozen=True)
class Scheme:
    group: int = 0
    alpha: float | None = None
    float_layers: tuple[str, ...] = ()
    threshold: float | None = None
    weights: bool = True
    activations: bool = True

    @classmethod
    def parse(cls, text: str) -> Scheme:
        given = dict(part.split("=", 1) for part in text.split(",") if part)
        return cls(
            group=int(given.get("group", 0)),
            alpha=float(given["alpha"]) if "alpha" in given else None,
            float_layers=tuple(word for word in given.get("float", "").split("+") if word),
            threshold=float(given["threshold"]) if "threshold" in given else None,
            weights=given.get("weights", "1") != "0",
            activations=given.get("activations", "1") != "0",
        )


def rounded(values: torch.Tensor, group: int) -> torch.Tensor:
    """``values`` through symmetric int8 and back, one scale per ``group`` along the last axis."""
    width = values.shape[-1]
    size = group if group and width % group == 0 else width
    grouped = values.reshape(*values.shape[:-1], width // size, size)
    scale = grouped.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return (torch.round(grouped / scale).clamp(-127, 127) * scale).reshape(values.shape)


def rounded_weight(
    module: torch.nn.Linear, name: str, scheme: Scheme, largest: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``module``'s weight as the scheme holds it, and the per-input divisor of its inputs."""
    weight = module.weight.detach()
    smooth = torch.ones(weight.shape[1])
    if scheme.alpha is not None:
        seen = largest[name].clamp_min(1e-5) ** scheme.alpha
        smooth = seen / weight.abs().amax(0).clamp_min(1e-5) ** (1 - scheme.alpha)
    return (rounded(weight * smooth, scheme.group) if scheme.weights else weight * smooth), smooth


def rounded_product(inputs: torch.Tensor, held: torch.Tensor, smooth: torch.Tensor, scheme: Scheme):
    scaled = inputs / smooth
    return (rounded(scaled, scheme.group) if scheme.activations else scaled) @ held.T


def linear_layers(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    return {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}


def simulate(model: torch.nn.Module, scheme: Scheme, largest, errors: dict[str, float]) -> float:
    """Give the scheme's linear layers its rounded product (their own forward kept); the share of
    the model's linear weights (so of a token's multiply-adds) that got it."""
    rounded_size = total_size = 0
    for name, module in linear_layers(model).items():
        total_size += module.weight.numel()
        if any(word in name for word in scheme.float_layers):
            continue
        if scheme.threshold is not None and errors[name] > scheme.threshold:
            continue
        rounded_size += module.weight.numel()
        held, smooth = rounded_weight(module, name, scheme, largest)

        def forward(self, inputs, held=held, smooth=smooth):
            output = rounded_product(inputs, held, smooth, scheme)
            return output if self.bias is None else output + self.bias

        module.forward = types.MethodType(forward, module)
    return rounded_size / total_size


def layer_errors(runtime, strategy, texts, scheme: Scheme, largest) -> dict[str, float]:
    """Each linear layer's relative error ||rounded - float32|| / ||float32|| over its own inputs
    while ``strategy`` embeds ``texts`` (every layer in float32, so errors do not compound)."""
    sums: dict[str, list[float]] = {}

    def measure(name: str):
        def hook(module, arguments, output):
            held, smooth = rounded_weight(module, name, scheme, largest)
            exact = arguments[0] @ module.weight.T
            difference = rounded_product(arguments[0], held, smooth, scheme) - exact
            seen = sums.setdefault(name, [0.0, 0.0])
            seen[0] += float(difference.square().sum())
            seen[1] += float(exact.square().sum())

        return hook

    hooks = [module.register_forward_hook(measure(n)) for n, module in linear_layers(runtime.model).items()]
    with torch.no_grad():
        strategy.encode(texts, "document")
    for hook in hooks:
        hook.remove()
    return {name: (error / norm) ** 0.5 for name, (error, norm) in sums.items()}


def show_errors(errors: dict[str, float]) -> None:
    """Each kind of layer (``q_proj`` ...): its errors' median and largest, and the worst layer."""
    kinds: dict[str, list[tuple[float, str]]] = {}
    for name, error in errors.items():
        kinds.setdefault(name.rsplit(".", 1)[-1], []).append((error, name))
    for kind, seen in kinds.items():
        seen.sort()
        print(f"  {kind}: median {seen[len(seen) // 2][0]:.4f}, largest {seen[-1][0]:.4f} ({seen[-1][1]})")


def restore(model: torch.nn.Module) -> None:
    for module in model.modules():
        module.__dict__.pop("forward", None)


def largest_activations(runtime, strategy, texts: list[str]) -> dict[str, torch.Tensor]:
    """Each linear layer's largest input per channel while ``strategy`` embeds ``texts``."""
    largest: dict[str, torch.Tensor] = {}

    def record(name: str):
        def hook(module, arguments):
            seen = arguments[0].detach().abs().reshape(-1, arguments[0].shape[-1]).amax(0)
            largest[name] = torch.maximum(largest[name], seen) if name in largest else seen

        return hook

    hooks = [
        module.register_forward_pre_hook(record(name))
        for name, module in runtime.model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    strategy.encode(texts, "document")
    for hook in hooks:
        hook.remove()
    return largest


def main() -> None:
    from ragidx.indexer.model import runtime as runtime_module
    from ragidx.indexer.strategies import create_strategy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategies", default="mean,aligned-wva,kv-embedding")
    parser.add_argument("--sts", type=Path, default=Path("../shared/eval/stsb/sts-dev.csv"))
    parser.add_argument("--scheme", action="append", required=True)
    arguments = parser.parse_args()
    with arguments.sts.open(encoding="utf-8") as table:
        pairs = list(csv.reader(table, delimiter="\t", quoting=csv.QUOTE_NONE))[:24]
    texts = [pair[5] for pair in pairs] + [pair[6] for pair in pairs] + passages(8, 200)
    runtime_module._packs_weights = lambda *given: False  # the simulation reads each layer's weight
    runtime = runtime_module.load_runtime(gguf_path(arguments.model), device="cpu", dtype="float32")
    strategies = {name: create_strategy(name, runtime) for name in arguments.strategies.split(",")}
    reference = {name: strategy.encode(texts, "document") for name, strategy in strategies.items()}
    calibration = passages(16, 200)[8:]  # not among the texts compared
    largest = largest_activations(runtime, next(iter(strategies.values())), calibration)
    for text in arguments.scheme:
        scheme = Scheme.parse(text)
        errors = layer_errors(runtime, next(iter(strategies.values())), calibration, scheme, largest)
        print(f"{text}: each layer's relative error", flush=True)
        show_errors(errors)
        share = simulate(runtime.model, scheme, largest, errors)
        cosines = {
            name: np.sum(strategy.encode(texts, "document") * reference[name], axis=1)
            for name, strategy in strategies.items()
        }
        restore(runtime.model)
        shown = "; ".join(f"{name} min {c.min():.4f} mean {c.mean():.5f}" for name, c in cosines.items())
        print(f"{text} ({share:.0%} of the weights int8): {shown}", flush=True)


if __name__ == "__main__":
    main()
