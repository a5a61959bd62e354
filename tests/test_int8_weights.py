"""int8 weights with float32 products (``--dtype int8``): the product equals its formula across
tiles, a loaded model computes exactly what a float32 model with the same rounded weights computes
(every strategy's hooks included), memory gives way to it under ``--dtype auto``, and a CPU
without bf16 instructions times it against float32."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from ragidx.cli import cli
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model import int8_weights, memory, precision
from ragidx.indexer.model.runtime import load_runtime, resolve_dtype
from tests.support.held_weights import (
    assert_held_equals_reference,
    assert_held_layout,
    decoder_strategies,
    fake_int8_model,
    rounded_by_hand,
)
from tests.support.model_checks import ONE_PER_MECHANISM


@pytest.mark.parametrize("tile", [int8_weights.TILE_WEIGHTS, 320])  # one tile; 5 rows a tile, 7 tiles
@pytest.mark.parametrize("tokens", [5, 600])  # 10 rows; 1,200: the wider tiles of a big batch
def test_the_int8_product_is_its_formula_across_tiles(monkeypatch, tile, tokens):
    monkeypatch.setattr(int8_weights, "TILE_WEIGHTS", tile)
    monkeypatch.setattr(int8_weights, "MANY_ROWS_TILE_WEIGHTS", 2 * tile)  # 10 rows a tile, 4 tiles
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 33, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(33, 64, generator=generator))
        layer.weight[3] = 0.25  # a row of equal weights: scale 1, no division by zero
        # a 4-bit block (step 0.01): held to 1% of a step (the float16 scale's rounding)
        layer.weight[4, :32] = torch.arange(16).repeat(2) * 0.01 - 0.02
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    inputs = torch.randn(2, tokens, 64, generator=generator)
    int8_weights.hold_int8(layer)
    assert layer.weight is None and layer.int8_weight.dtype == torch.int8
    expected = inputs @ rounded_by_hand(weight).T + bias
    torch.testing.assert_close(layer(inputs), expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(rounded_by_hand(weight)[3:5, :32], weight[3:5, :32], rtol=0, atol=1e-4)
    spans = weight.view(33, 2, 32).amax(dim=2) - weight.view(33, 2, 32).amin(dim=2)
    assert bool(((rounded_by_hand(weight) - weight).abs().view(33, 2, 32) <= spans[..., None] / 255).all())


def test_a_row_that_does_not_split_into_groups_is_one_group():
    layer = torch.nn.Linear(40, 3, bias=False)
    weight = layer.weight.detach().clone()
    int8_weights.hold_int8(layer)
    assert layer.weight_scales.shape == (3, 1)
    inputs = torch.randn(4, 40)
    torch.testing.assert_close(layer(inputs), inputs @ rounded_by_hand(weight, 40).T, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_an_int8_model_computes_what_float32_computes_with_the_same_rounded_weights(tiny_models, arch):
    """Every decoder strategy (value hooks, re-routed attention, placeholders, captured states)
    gives the vectors of a float32 model holding the same rounded weights; single texts go through
    a trace that equals them too."""
    folder = str(tiny_models[arch])
    runtime = load_runtime(folder, device="cpu", dtype="int8")
    assert_held_layout(runtime, "int8", "int8_weight", torch.bfloat16)
    names = decoder_strategies() if arch == "llama" else ONE_PER_MECHANISM
    assert_held_equals_reference(runtime, fake_int8_model(folder), names)


def test_an_int8_model_answers_with_an_int8_head_of_its_own(tmp_path):
    """``ragidx ask`` on an int8 model: the tied head is an int8 copy of the embedding (which
    stays 16-bit for the model's input), and the logits are the rounded float32 model's."""
    from transformers import AutoModelForCausalLM

    from ragidx.app.generation import causal_lm
    from tests.support.tiny_models import save_tiny_model

    folder = save_tiny_model("llama", tmp_path / "llama", overrides={"tie_word_embeddings": True})
    ours = causal_lm(load_runtime(str(folder), device="cpu", dtype="int8"))
    theirs = fake_int8_model(folder, AutoModelForCausalLM)
    ids = torch.tensor([[1, 17, 230, 5, 99, 41, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-5, atol=1e-5)
    assert ours.lm_head.int8_weight.dtype == torch.int8
    assert ours.get_input_embeddings().weight.dtype == torch.bfloat16


@pytest.mark.parametrize("bf16_instructions", [True, False])
def test_auto_gives_way_to_memory_and_a_refusal_names_what_fits(monkeypatch, bf16_instructions):
    """Where float32 does not fit, bf16 comes next only on a CPU that has bf16 instructions: one
    without them emulates bf16 at about a hundredth of float32's speed, so float16 weights (float32
    products) come next there; int8 weights after either."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: 3_000)
    monkeypatch.setattr(memory, "cpu_has_bfloat16_instructions", lambda: bf16_instructions)
    leaner = "bfloat16" if bf16_instructions else "float16"
    assert memory.auto_dtype(1_000, "float32", "cpu")[0] == leaner  # 16 bits: 2,000 bytes, int8: 1,250
    assert memory.auto_dtype(2_000, "float32", "cpu")[0] == "int8"  # 2,500 bytes
    assert memory.auto_dtype(2_000, "bfloat16", "cuda")[0] == "int8"
    assert memory.auto_dtype(1_000, "float32", "cuda")[0] == "bfloat16"  # a GPU has bf16 products
    assert memory.auto_dtype(9_000, "float32", "cpu")[0] == "float32"
    with pytest.raises(RagidxError, match=r"in float32 and cpu has 0\.0 GB available; use --dtype int8 \("):
        memory.check_fits("m", 2_000, "float32", "cpu")
    named = r"use --dtype float16"
    if bf16_instructions:
        named = r"use --dtype bfloat16 \(0\.0 GB\), --dtype float16"
    with pytest.raises(RagidxError, match=named):
        memory.check_fits("m", 1_000, "float32", "cpu")


def test_on_a_gpu_auto_keeps_room_for_a_batch_beside_the_weights(monkeypatch):
    """An 8B model on a card with 14 GiB free: its bf16 weights (14.4 GB) fit but leave no room for
    a batch (on an H100 the first one ran out of memory down to a single row, where cuBLAS failed),
    so ``auto`` takes int8; with 16 GiB free, bf16 and its smaller batches."""
    config = SimpleNamespace(hidden_size=4096, intermediate_size=14336)  # Llama 3.1 8B's widths
    parameters = 7_180_000_000
    # twice the activations of 2,048 tokens (four copies of hidden + MLP widths) and 512 MiB
    assert memory.device_reserve("bfloat16", "cuda", config) == 2 * 2048 * 4 * 18432 * 2 + 2**29
    assert memory.device_reserve("int8", "cuda", config) == 2 * 2048 * 4 * 18432 * 4 + 2**29
    assert memory.device_reserve("bfloat16", "cpu", config) == 0
    monkeypatch.setattr(memory, "available_bytes", lambda device: 14 * 2**30)
    assert memory.auto_dtype(parameters, "bfloat16", "cuda", config)[0] == "int8"
    assert memory.auto_dtype(parameters, "bfloat16", "cpu", config)[0] == "bfloat16"
    refusal = (
        r"need 14\.4 GB in bfloat16 \(and 1\.1 GB for a batch\) and cuda has 15\.0 GB available; "
        r"use --dtype int8 \(10\.7 GB\), a smaller"
    )
    with pytest.raises(RagidxError, match=refusal):
        memory.check_fits("m", parameters, "bfloat16", "cuda", config)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 16 * 2**30)
    assert memory.auto_dtype(parameters, "bfloat16", "cuda", config)[0] == "bfloat16"


def test_the_memory_fallback_loads_int8_where_float32_would_not_fit(tiny_models, monkeypatch):
    folder = tiny_models["llama"]
    parameters = memory.folder_parameters(folder)
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(parameters * 1.5))
    assert load_runtime(str(folder), device="cpu", dtype="auto").precision == "int8"
    with pytest.raises(RagidxError, match=r"does not fit.* use --dtype int8"):
        load_runtime(str(folder), device="cpu", dtype="float32")


def test_auto_holds_leaner_weights_where_float32_would_take_over_a_share_of_memory(
    tiny_models, sample_corpus, tmp_path, monkeypatch
):
    """Memory that fits float32 is not reason enough to hold it: past a sixth of the machine (a 1B
    model's 4.3 GB is a quarter of a 16 GB laptop), ``auto`` holds float16 weights where they are
    within it, else int8, and says why, in the runtime, the build's summary and ``info``; at or
    below the share, and for an explicit dtype, float32 stands."""
    folder = tiny_models["llama"]
    parameters = memory.folder_parameters(folder)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**40)
    monkeypatch.setattr(memory, "cpu_has_bfloat16_instructions", lambda: False)
    monkeypatch.setattr(memory, "total_bytes", lambda: 6 * 4 * parameters)  # float32: exactly the share
    assert memory.auto_dtype(parameters, "float32", "cpu") == ("float32", "")
    monkeypatch.setattr(memory, "total_bytes", lambda: 6 * 4 * parameters - 6)
    dtype, reason = memory.auto_dtype(parameters, "float32", "cpu")
    assert dtype == "float16" and reason.startswith("float32 weights would take 0.0 GB, over 1/6 of 0.0 GB")
    assert memory.auto_dtype(parameters, "bfloat16", "cpu") == ("bfloat16", "")  # bf16 products: kept
    assert memory.auto_dtype(parameters, "float32", "cuda")[0] == "float32"
    monkeypatch.setattr(memory, "total_bytes", lambda: 6 * 2 * parameters - 6)  # float16 over it too
    assert memory.auto_dtype(parameters, "float32", "cpu")[0] == "int8"
    monkeypatch.setattr(memory, "total_bytes", lambda: 6 * 4 * parameters - 6)
    runtime = load_runtime(str(folder), device="cpu", dtype="auto")
    assert (runtime.precision, runtime.precision_reason) == ("float16", reason)
    assert load_runtime(str(folder), device="cpu", dtype="float32").precision == "float32"
    index = tmp_path / "index"
    build = ["build", str(sample_corpus / "notes"), "--model", str(folder), "--index", str(index), "--dense"]
    shown = CliRunner().invoke(cli, build, env={"RAGIDX_NO_DAEMON": "1"}, catch_exceptions=False).output
    assert f"model {folder} (float16: {reason}), strategy" in shown
    info = CliRunner().invoke(cli, ["info", "--index", str(index), "--json"], catch_exceptions=False).output
    assert json.loads(info)["dtype_reason"] == reason


SHAPE = SimpleNamespace(hidden_size=576, intermediate_size=1536)


@pytest.mark.parametrize(("half_gflops", "chosen"), [(108.0, "float16"), (107.0, "float32")])
def test_without_bf16_instructions_auto_takes_float16_weights_where_a_build_keeps_up(
    monkeypatch, tmp_path, half_gflops, chosen
):
    """The probe times float32 plain and packed, float16 weights and int8 x int8 products, never
    int8 weights (an upcast before a float32 product: never faster) nor emulated bf16; float16
    weights are taken at 0.9x the faster float32 or better (half the memory, faster queries), not
    below. Integer products are kept for the strategies admitted (tests/test_int8_products.py)."""
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_bfloat16_instructions", lambda: False)
    monkeypatch.setattr(precision, "can_pack_linear_weights", lambda dtype: True)
    timed = []

    def rate(dtype, inputs, outputs, tokens=256, packed=False):
        timed.append((dtype, packed) if tokens == 256 else (dtype, packed, tokens))
        speeds = {("float32", False): 100.0, ("float32", True): 120.0, ("float16", False): half_gflops}
        speeds[("w8a8", False)] = 150.0
        return speeds[(dtype, packed)] * (1e9 if tokens == 256 else 0.5e9)

    monkeypatch.setattr(precision, "linear_flops_per_second", rate)
    assert resolve_dtype("auto", "cpu", SHAPE) == chosen
    assert resolve_dtype("auto", "cpu", SHAPE) == chosen  # cached: timed once
    query = [("w8a8", False, 12), (chosen, chosen == "float32", 12)]  # both at a query's rows
    assert timed == [("float32", False), ("float32", True), ("float16", False), ("w8a8", False), *query]
    assert precision.packs_float32(576, 1536)
    (entry,) = json.loads((tmp_path / "precision.json").read_text()).values()
    assert entry == {
        "float32_gflops": 100.0,
        "packed_float32_gflops": 120.0,
        "bfloat16_gflops": 0.0,
        "half_gflops": half_gflops,
        "integer_gflops": 150.0,
        "integer_query_gflops": 75.0,
        "float_query_gflops": half_gflops / 2 if chosen == "float16" else 60.0,
    }
