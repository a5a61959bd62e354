"""What the held-weight tests (int8 and float16 weights, float32 products) compare against: the
same model in float32, its weights rounded by the tests' own hand, run by the same strategies."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from transformers import AutoModel

from ragidx.indexer.model import int8_weights
from ragidx.indexer.model.runtime import ModelRuntime
from ragidx.indexer.strategies import REGISTRY, create_strategy

# Token prepending's placeholder rows are set in the embedding's type, 16-bit here (float32 in the
# reference): their rounding moves its vectors by up to 7e-4.
PLACEHOLDER_ROUNDING = {"htp": 2e-3, "tp": 2e-3}
TEXTS = ["Keep the compost heap damp and airy.", "Tides", "Turn the heap every week, so air gets in."]


def rounded_model(
    folder, loads_as: torch.dtype, round_linear: Callable[[torch.Tensor], torch.Tensor], kind=AutoModel
) -> torch.nn.Module:
    """The folder's model in float32 with every weight rounded as a held run rounds it: to the
    16-bit type it loads in, then each linear layer's weight by ``round_linear``."""
    model = kind.from_pretrained(folder, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    if head is not None:  # a head tied to the embedding is rounded on its own; the embedding is not
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
    with torch.no_grad():
        for module in model.modules():
            for parameter in module.parameters(recurse=False):
                parameter.copy_(parameter.to(loads_as).float())
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(round_linear(module.weight))
    return model


def decoder_strategies() -> list[str]:
    return sorted(name for name, cls in REGISTRY.items() if cls.decoder_only)


def assert_held_layout(
    runtime: ModelRuntime, precision: str, held: str, embedding_dtype: torch.dtype
) -> None:
    """Every linear layer holds its weight as ``held`` (no float weight left), the embedding stays
    16-bit, everything else is float32, and the runtime says it computes in float32."""
    assert runtime.precision == precision and runtime.dtype == torch.float32
    linears = [module for module in runtime.model.modules() if isinstance(module, torch.nn.Linear)]
    assert linears and all(module.weight is None and hasattr(module, held) for module in linears)
    matrix = runtime.model.get_input_embeddings().weight
    assert matrix.dtype == embedding_dtype
    assert {p.dtype for p in runtime.model.parameters() if p is not matrix} == {torch.float32}


def assert_held_equals_reference(runtime: ModelRuntime, reference: torch.nn.Module, names: list[str]) -> None:
    """Every named strategy gives the reference model's vectors; single texts go through a trace
    that equals them too."""
    held = ModelRuntime(reference, runtime.tokenizer, "reference")
    for name in names:
        got = create_strategy(name, runtime).encode(TEXTS, "document")
        expected = create_strategy(name, held).encode(TEXTS, "document")
        np.testing.assert_allclose(got, expected, atol=PLACEHOLDER_ROUNDING.get(name, 2e-5), err_msg=name)
    strategy = create_strategy("aligned-wva", runtime)
    singles = np.stack([strategy.encode([text], "query")[0] for text in TEXTS])
    assert strategy.one_row.trace is not None
    np.testing.assert_allclose(singles, strategy.encode(TEXTS, "query"), atol=2e-5)


def rounded_by_hand(weight: torch.Tensor, group: int = int8_weights.GROUP) -> torch.Tensor:
    """A weight as the int8 path holds it, computed here: each group of a row spans its minimum
    to maximum in 255 steps, scale and offset (the weight int8 0 stands for) in float16."""
    out = weight.clone()
    for row in range(weight.shape[0]):
        for start in range(0, weight.shape[1], group):
            values = weight[row, start : start + group]
            step = ((values.max() - values.min()) / 255).half().float()
            step = step if step > 0 else torch.tensor(1.0)
            zero = (values.min() + 128 * step).half().float()
            out[row, start : start + group] = ((values - zero) / step).round().clamp(-128, 127) * step + zero
    return out


def fake_int8_model(folder, kind=AutoModel) -> torch.nn.Module:
    """The folder's model in float32 with every weight rounded as the int8 path rounds it: to the
    16-bit type it loads in, then each linear layer's rows to int8 (an independent computation)."""
    return rounded_model(folder, torch.bfloat16, rounded_by_hand, kind)
