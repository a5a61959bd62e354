"""float16 weights with float32 products (``--dtype float16`` on a CPU): fbgemm's packed product
equals its formula on float16-rounded weights, holds a GGUF cache's bf16 values exactly, and a
loaded model computes what a float32 model holding the same rounded weights computes (every
strategy's hooks, the traced readout and ``ask``'s head included)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ragidx.indexer.model import half_weights
from ragidx.indexer.model.runtime import load_runtime
from tests.support.held_weights import (
    assert_held_equals_reference,
    assert_held_layout,
    rounded_model,
)
from tests.support.model_checks import ONE_PER_MECHANISM

pytestmark = pytest.mark.skipif(
    not half_weights.can_hold_half_weights(), reason="this torch lacks fbgemm (not an x86 build)"
)


def to_half(weight: torch.Tensor) -> torch.Tensor:
    return weight.half().float()


@pytest.mark.parametrize("tokens", [1, 12, 700])
def test_the_half_product_is_its_formula_on_float16_weights(tokens):
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 33, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(33, 64, generator=generator) * (1 + 2**-13))  # not float16 values
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    inputs = torch.randn(2, tokens, 64, generator=generator)
    half_weights.hold_half(layer)
    assert layer.weight is None
    assert "LinearPackedParamsBase" in layer.half_weight._type().qualified_name()  # fbgemm's packed weight
    got = layer(inputs)
    torch.testing.assert_close(got, inputs @ to_half(weight).T + bias, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, inputs @ weight.T + bias, rtol=1e-6, atol=1e-6)  # the weights were rounded


def test_a_gguf_caches_bf16_weights_are_held_exactly():
    """bf16 values within float16's normal range are float16 values: nothing is rounded."""
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    normal = weight.sign() * weight.abs().clamp_min(torch.finfo(torch.float16).tiny)  # no subnormals
    weight = normal.bfloat16()
    packed = half_weights.pack_half(weight)
    unpacked, _ = torch.ops.quantized.linear_unpack_fp16(packed)
    assert torch.equal(unpacked.float(), weight.float())


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_a_float16_model_on_a_cpu_computes_what_float32_computes_with_float16_weights(tiny_models, arch):
    folder = str(tiny_models[arch])
    runtime = load_runtime(folder, device="cpu", dtype="float16")
    assert_held_layout(runtime, "float16", "half_weight", torch.float16)
    # one strategy per mechanism: every strategy's hooks over held weights are the int8 test's
    assert_held_equals_reference(runtime, rounded_model(folder, torch.float16, to_half), ONE_PER_MECHANISM)


def test_a_float16_model_answers_with_a_float16_head_of_its_own(tmp_path):
    from ragidx.app.generation import causal_lm
    from tests.support.tiny_models import save_tiny_model

    folder = save_tiny_model("llama", tmp_path / "llama", overrides={"tie_word_embeddings": True})
    ours = causal_lm(load_runtime(str(folder), device="cpu", dtype="float16"))
    theirs = rounded_model(folder, torch.float16, to_half, AutoModelForCausalLM)
    ids = torch.tensor([[1, 17, 230, 5, 99, 41, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-5, atol=1e-5)
    assert hasattr(ours.lm_head, "half_weight") and ours.get_input_embeddings().weight.dtype == torch.float16
