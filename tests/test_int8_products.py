"""int8 x int8 products (``--dtype w8a8``): the product equals its formula (7-bit activations with a
row's own offset and step, SmoothQuant's migration, a signed Hadamard rotation in blocks of 64,
per-row int8 weights), a row's output never
depends on the rest of its batch, and a loaded model computes what a float32 model does with the
same rounding done by hand, calibrated on the same texts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ragidx.cli import cli
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model import int8_products
from ragidx.indexer.model.calibration_texts import CALIBRATION_TEXTS
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime, resolve_dtype
from ragidx.indexer.strategies import create_strategy
from tests.support.held_weights import TEXTS, assert_held_layout, fake_int8_model
from tests.support.model_checks import ONE_PER_MECHANISM

pytestmark = pytest.mark.skipif(not int8_products.can_multiply_integers(), reason="no fbgemm in this torch")


def rotation_by_hand(inputs: int) -> torch.Tensor:
    """The rotation as one ``inputs x inputs`` matrix: the layer's signs on the diagonal times the
    block-diagonal of Kronecker powers of the 2x2 Hadamard matrix, blocks of 64 inputs (or of the
    largest power of two dividing their number)."""
    signs = int8_products.rotation_signs(inputs)
    assert set(signs.tolist()) <= {-1.0, 1.0} and torch.equal(signs, int8_products.rotation_signs(inputs))
    block = torch.ones(1, 1, dtype=torch.float64)
    while len(block) < 64 and inputs % (2 * len(block)) == 0:
        block = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), block)
    block /= len(block) ** 0.5
    return torch.diag(signs.double()) @ torch.block_diag(*[block] * (inputs // len(block)))


def product_by_hand(inputs, weight, bias, largest, rotate=True):
    """The formula, computed here in float64 after the same roundings: inputs divided and weight
    columns multiplied by ``largest^0.5 / column_max^0.5``, both then rotated by the same orthonormal
    matrix (so the float product is unchanged) unless ``rotate`` is false; weight rows rounded to
    int8 by their largest value; each input row to 0..127 between its own lowest and highest value."""
    divisors = largest.clamp_min(1e-5).sqrt() / weight.abs().amax(0).clamp_min(1e-5).sqrt()
    inputs_count = weight.shape[1]
    rotation = rotation_by_hand(inputs_count) if rotate else torch.eye(inputs_count, dtype=torch.float64)
    moved = ((weight * divisors).double() @ rotation).float()
    row_scales = moved.abs().amax(1) / 127
    held = (moved / row_scales[:, None]).round().clamp(-127, 127).double() * row_scales.double()[:, None]
    scaled = ((inputs * (1.0 / divisors)).double() @ rotation).float()
    lowest, highest = scaled.amin(-1, keepdim=True), scaled.amax(-1, keepdim=True)
    step = (highest - lowest).clamp_min(1e-12) / 127  # a constant row (padding): no division by 0
    levels = ((scaled - lowest) / step).round().clamp(0, 127)
    rounded = levels.double() * step.double() + lowest.double()
    return (rounded @ held.T + bias.double()).float()


@pytest.mark.parametrize("adversarial", [False, True])
def test_the_integer_product_is_its_formula(adversarial, monkeypatch):
    """Rotated, with the weight rotated a few rows at a time as a 1B layer's is; and, not rotated
    (a rotation mixes the signs), where AVX2's pairwise int16 sums would saturate with 8-bit
    activations (all inputs positive against rows of equal-signed weights: 97% off with 8 bits)."""
    monkeypatch.setattr(int8_products, "ROTATED_ROWS", 16)
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(96, 40, bias=True)
    inputs = torch.randn(2, 7, 96, generator=generator)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(40, 96, generator=generator) * 0.05)
        if adversarial:
            layer.weight.copy_(layer.weight.abs() * torch.sign(torch.randn(40, 1, generator=generator)))
            inputs = inputs.abs() + 3.0
        inputs[..., 5] *= 40  # an outlier channel, as decoders have
    largest = inputs.abs().reshape(-1, 96).amax(0) * 1.5
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    int8_products.hold_integer(layer, layer.weight, largest, rotate=not adversarial)
    assert layer.weight is None
    expected = product_by_hand(inputs, weight, bias, largest, rotate=not adversarial)
    torch.testing.assert_close(layer(inputs), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_the_rotation_leaves_the_float_product_unchanged():
    """Rotating inputs and weight columns alike moves only what is rounded: the signs and blocks are
    orthonormal, so the rotated float product is the plain one."""
    generator = torch.Generator().manual_seed(2)
    weight, inputs = torch.randn(40, 192, generator=generator), torch.randn(7, 192, generator=generator)
    block = int8_products.rotation_block(192)
    signs = int8_products.rotation_signs(192)
    rotated_inputs, rotated_weight = (int8_products.rotated(each * signs, block) for each in (inputs, weight))
    torch.testing.assert_close(rotated_inputs @ rotated_weight.T, inputs @ weight.T, rtol=0, atol=1e-4)


def test_a_rows_output_does_not_depend_on_its_batch():
    """Every scale is one row's own, the rotation a row's own product and integer sums are exact: a
    chunk's vector is the same bit for bit alone or beside others (resumed builds, batched queries)."""
    layer = torch.nn.Linear(576, 48, bias=False)
    int8_products.hold_integer(layer, layer.weight, None)
    batch = torch.randn(9, 576) * torch.logspace(-1, 2, 9)[:, None]
    together = layer(batch)
    alone = torch.cat([layer(batch[row : row + 1]) for row in range(9)])
    assert torch.equal(together, alone)


def integer_model_by_hand(folder) -> torch.nn.Module:
    """The folder's model as the w8a8 path should compute it, built independently: int8 weights in
    groups (as it loads), each linear layer's largest inputs seen on the calibration texts, then
    every linear layer computing :func:`product_by_hand`."""
    model = fake_int8_model(folder)
    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    largest: dict[torch.nn.Module, torch.Tensor] = {}

    def record(module, arguments):
        seen = arguments[0].abs().reshape(-1, arguments[0].shape[-1]).amax(0)
        largest[module] = torch.maximum(largest[module], seen) if module in largest else seen

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    hooks = [module.register_forward_pre_hook(record) for module in linears]
    with torch.no_grad():
        for text in CALIBRATION_TEXTS:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    for hook in hooks:
        hook.remove()
    for module in linears:
        weight = module.weight.detach().clone()
        bias = module.bias.detach().clone() if module.bias is not None else torch.zeros(weight.shape[0])

        def forward(inputs, weight=weight, bias=bias, seen=largest[module]):
            return product_by_hand(inputs, weight, bias, seen)

        module.forward = forward
    return model


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_a_w8a8_model_computes_its_formula_for_every_mechanism(tiny_models, arch):
    """Each linear layer is the formula with the largest inputs the calibration texts gave it; value
    hooks, re-routed attention, placeholders and captured states all run on integer products, and
    single texts go through a trace that equals them. End to end the vectors are close, not equal:
    another summation order upstream flips a rounding now and then (one activation one step off),
    which moves a tiny random model's vectors by up to 3e-2."""
    folder = str(tiny_models[arch])
    runtime = load_runtime(folder, device="cpu", dtype="w8a8")
    assert_held_layout(runtime, "w8a8", "integer_weight", torch.bfloat16)
    reference = integer_model_by_hand(folder)
    expected_layers = dict(reference.named_modules())
    generator = torch.Generator().manual_seed(1)
    for name, module in runtime.model.named_modules():
        if isinstance(module, torch.nn.Linear):
            inputs = torch.randn(5, module.in_features, generator=generator)
            expected = expected_layers[name](inputs)
            # 2e-3: one activation a level off, a tie that float32's last bit breaks the other way
            # (8e-4, seen on Gemma's up_proj), passes; a missing rotation is 1-2e-2 off
            tolerance = 2e-3 * float(expected.abs().max())
            torch.testing.assert_close(module(inputs), expected, rtol=0, atol=tolerance, msg=name)
    by_hand = ModelRuntime(reference, runtime.tokenizer, "reference")
    for strategy in ONE_PER_MECHANISM:
        got = create_strategy(strategy, runtime).encode(TEXTS, "document")
        expected = create_strategy(strategy, by_hand).encode(TEXTS, "document")
        assert np.sum(got * expected, axis=1).min() > 0.99, strategy
    strategy = create_strategy("aligned-wva", runtime)
    singles = np.stack([strategy.encode([text], "query")[0] for text in TEXTS])
    assert strategy.one_row.trace is not None
    np.testing.assert_allclose(singles, strategy.encode(TEXTS, "query"), atol=2e-6)


def test_w8a8_runs_on_a_cpu_only():
    with pytest.raises(RagidxError, match="--dtype w8a8 runs on an x86 CPU only"):
        resolve_dtype("w8a8", "cuda")


def test_auto_takes_integer_products_only_for_strategies_admitted_and_says_why(
    tiny_models, sample_corpus, tmp_path, monkeypatch
):
    """On a CPU where integer products measured faster, ``auto`` runs them for an admitted strategy
    named (a model's default is not known before it loads), keeps float products for one that is
    not and says why in the runtime, the build's summary and ``info``; a runtime that embeds with no
    one strategy keeps float products; a query embeds in the index's dtype."""
    from ragidx.indexer.model import integer_admission, runtime

    monkeypatch.setattr(runtime, "integer_speedup", lambda hidden, intermediate: 2.0)
    monkeypatch.setattr(integer_admission, "ADMITTED", frozenset({"aligned-wva"}))
    monkeypatch.setitem(integer_admission.KEPT_FLOAT, "kv-embedding", "measured too far from float32")
    monkeypatch.delitem(integer_admission.KEPT_FLOAT, "cot")  # as a strategy added later would be
    folder = str(tiny_models["llama"])
    admitted = load_runtime(folder, device="cpu", dtype="auto", strategy="aligned-wva")
    assert admitted.precision == "w8a8"
    said = "integer products, 2.0x faster here; aligned-wva keeps its quality in them"
    assert admitted.precision_reason == said
    assert load_runtime(folder, device="cpu", dtype="auto", strategy="").precision == "float32"  # not known
    kept = load_runtime(folder, device="cpu", dtype="auto", strategy="kv-embedding")
    reason = "kv-embedding keeps float products: measured too far from float32"
    assert (kept.precision, kept.precision_reason) == ("float32", reason)
    assert load_runtime(folder, device="cpu", dtype="auto", strategy="cot").precision_reason == (
        "cot keeps float products: not measured with integer products"
    )
    assert load_runtime(folder, device="cpu", dtype="auto").precision == "float32"
    monkeypatch.setattr(runtime, "integer_speedup", lambda hidden, intermediate: 1.1)  # not worth it
    assert load_runtime(folder, device="cpu", dtype="auto", strategy="aligned-wva").precision == "float32"
    monkeypatch.setattr(runtime, "integer_speedup", lambda hidden, intermediate: 2.0)

    def build(strategy: str, index) -> str:
        arguments = ["build", str(sample_corpus / "notes"), "--model", folder, "--strategy", strategy]
        arguments += ["--index", str(index), "--dense"]
        shown = CliRunner().invoke(cli, arguments, env={"RAGIDX_NO_DAEMON": "1"}, catch_exceptions=False)
        return shown.output

    assert f"model {folder} (float32: {reason}), strategy" in build("kv-embedding", tmp_path / "kept")
    info = CliRunner().invoke(cli, ["info", "--index", str(tmp_path / "kept"), "--json"]).output
    assert json.loads(info)["dtype_reason"] == reason
    assert "(w8a8: integer products, 2.0x faster here" in build("aligned-wva", tmp_path / "integer")
    query = ["query", "compost", "--index", str(tmp_path / "integer"), "--mode", "dense", "--json"]
    found = CliRunner().invoke(cli, query, env={"RAGIDX_NO_DAEMON": "1"}, catch_exceptions=False).output
    assert json.loads(found)  # embedded in w8a8, the index's dtype
    info = CliRunner().invoke(cli, ["info", "--index", str(tmp_path / "integer"), "--json"]).output
    assert json.loads(info)["dtype"] == "w8a8"
