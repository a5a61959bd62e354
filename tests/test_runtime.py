"""Model loading, batching and early exit."""

from __future__ import annotations

import json

import pytest
import torch
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.runtime import load_runtime, plan_batches, resolve_device, resolve_dtype


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
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RagidxError, match="no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(RagidxError, match="unknown dtype"):
        resolve_dtype("int4", "cpu")


def test_bfloat16_loads_and_stays_close_to_float32(tiny_models, runtimes):
    from ragidx.indexer.strategies import create_strategy

    text = ["Keep the compost heap damp and airy, with greens and browns mixed."]
    reference = create_strategy("mean", runtimes["llama"]).encode(text)
    runtime = load_runtime(str(tiny_models["llama"]), device="cpu", dtype="bfloat16")
    assert runtime.dtype == torch.bfloat16
    assert float((create_strategy("mean", runtime).encode(text) * reference).sum()) > 0.99
