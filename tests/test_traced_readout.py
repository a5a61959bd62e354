"""Single texts are embedded through a trace of the strategy's readout from the second one on:
the vectors must equal the eager readout's bit for bit, on every architecture, in float32 and in
bf16 (where the trace goes through the pre-packed products), for rows of other lengths than the
one traced, and past a sliding window (where the trace must not be used)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ragidx.indexer.model.runtime import Batch, load_runtime
from ragidx.indexer.strategies import create_strategy, strategy_class
from ragidx.indexer.strategies.traced_readout import SETTLING_CALLS, TracedReadout, longest_traceable, settle
from tests.support.model_checks import eager_vector

TEXTS = [
    "Keep the compost heap damp.",
    "A longer text about gardens, compost, greens and browns mixed well over the autumn months.",
    "Short one",
    "Turn the heap every week so that air reaches its middle and it never smells of anything.",
    "Tides",
]
TRACEABLE = ["mean", "last", "prompteol", "va", "wva", "aligned-wva", "kv-embedding"]


def one_at_a_time(strategy, texts: list[str]) -> np.ndarray:
    return np.stack([strategy.encode([text], "query")[0] for text in texts])


def test_every_traceable_strategy_declares_itself():
    assert {name for name in TRACEABLE if strategy_class(name).traceable} == set(TRACEABLE)
    assert not strategy_class("htp").traceable  # its readout reads the prepared rows' positions


def strategies_for(runtime) -> list[str]:
    """Every traceable strategy on Llama; elsewhere one per mechanism the trace must record:
    the whole forward (mean), capture hooks with early exit (aligned-wva), re-routed attention."""
    if not runtime.arch.is_decoder:
        return ["mean"]
    return TRACEABLE if runtime.arch.model_type == "llama" else ["mean", "aligned-wva", "kv-embedding"]


def assert_traced_equals_eager(runtime) -> None:
    for name in strategies_for(runtime):
        strategy = create_strategy(name, runtime)
        got = one_at_a_time(strategy, TEXTS)
        assert strategy.one_row.trace is not None, (runtime.model_id, name)
        expected = np.stack([eager_vector(strategy, text) for text in TEXTS])
        np.testing.assert_array_equal(got, expected, err_msg=f"{runtime.model_id} {name} {runtime.dtype}")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "bert"])
def test_traced_single_texts_equal_the_eager_readout(runtimes, arch):
    assert_traced_equals_eager(runtimes[arch])


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_traced_bfloat16_goes_through_the_packed_products_and_equals_eager(tiny_models, arch):
    """Through the packed products where this CPU packs bf16 weights, the plain ones elsewhere."""
    from ragidx.indexer.model.packed_linear import can_pack_linear_weights

    runtime = load_runtime(str(tiny_models[arch]), device="cpu", dtype="bfloat16")
    linears = [module for module in runtime.model.modules() if isinstance(module, torch.nn.Linear)]
    packs = can_pack_linear_weights()
    assert linears and all(hasattr(module, "packed_weight") == packs for module in linears)
    assert_traced_equals_eager(runtime)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_traced_float32_goes_through_the_packed_products_and_equals_eager(tiny_models, arch):
    """Packed as a probed model's float32 weights are where that is measured faster (the tiny
    models are too small to probe, so they are packed here by hand)."""
    from ragidx.indexer.model.packed_linear import can_pack_linear_weights, pack_linear_weights

    if not can_pack_linear_weights("float32"):
        pytest.skip("this CPU does not pack float32 weights (not x86, or torch without oneDNN)")
    runtime = load_runtime(str(tiny_models[arch]), device="cpu", dtype="float32")
    assert pack_linear_weights(runtime.model) > 0
    assert_traced_equals_eager(runtime)


def test_the_first_single_text_runs_eagerly_and_batches_never_use_the_trace(runtimes):
    strategy = create_strategy("aligned-wva", runtimes["llama"])
    strategy.encode([TEXTS[0]], "query")
    assert strategy.one_row.trace is None  # a one-shot `ragidx query` pays no tracing
    strategy.encode(TEXTS, "document")
    assert strategy.one_row.trace is None and strategy.one_row.calls == 1
    strategy.encode([TEXTS[1]], "query")
    assert strategy.one_row.trace is not None


def test_rows_past_the_sliding_window_stay_eager(runtimes):
    runtime = runtimes["gemma3_text"]  # sliding window 32 tokens in the tiny model
    strategy = create_strategy("prompteol", runtime)
    assert strategy.one_row.limit == runtime.model.config.sliding_window == 32
    long_text = " ".join(TEXTS[:2])
    assert len(strategy.token_ids(long_text, "query")) > 32
    one_at_a_time(strategy, TEXTS[2:] + TEXTS[2:])
    assert strategy.one_row.trace is not None
    calls = strategy.one_row.calls
    np.testing.assert_array_equal(one_at_a_time(strategy, [long_text])[0], eager_vector(strategy, long_text))
    assert strategy.one_row.calls == calls  # not replayed


def test_a_readout_that_cannot_be_traced_stays_eager(runtimes):
    runtime = runtimes["llama"]
    strategy = create_strategy("mean", runtime)

    def refuses_tracing(batch: Batch) -> torch.Tensor:
        if torch.jit.is_tracing():
            raise RuntimeError("not traceable")
        return strategy.readout(batch, ())

    readout = TracedReadout(runtime, refuses_tracing)
    ids = torch.tensor([strategy.token_ids(TEXTS[0], "query")])
    batch = Batch.single(ids)
    expected = strategy.readout(batch, ())
    for _ in range(3):
        torch.testing.assert_close(readout(batch), expected, rtol=0, atol=0)
    assert readout.failed and readout.trace is None


def test_length_dependent_rotary_scaling_and_other_devices_are_never_traced(runtimes):
    config = runtimes["llama"].model.config.to_dict()

    def limit(rope: dict, device: str = "cpu") -> int | None:
        model = SimpleNamespace(config=SimpleNamespace(**{**config, "rope_parameters": rope}))
        return longest_traceable(SimpleNamespace(model=model, device=torch.device(device)))

    assert limit({"rope_type": "default", "rope_theta": 10_000.0}) is None
    assert limit({"rope_type": "llama3", "factor": 8.0}) is None  # fixed frequencies
    assert limit({"rope_type": "dynamic", "factor": 2.0}) == 0
    assert limit({"rope_type": "longrope", "factor": 2.0}) == 0
    per_layer_type = {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "yarn"}}
    assert limit(per_layer_type) is None
    per_layer_type["full_attention"] = {"rope_type": "dynamic"}
    assert limit(per_layer_type) == 0
    assert limit({"rope_type": "default"}, device="meta") == 0


def test_a_one_token_row_is_never_traced_so_longer_rows_replay_correctly(runtimes):
    """transformers attends a lone query token on another path (grouped heads reshaped, not
    repeated): a trace recorded on a one-token row (a query like "python" as the second text) fixed
    that path, and every longer query after it failed with a reshape error. One-token rows stay eager."""
    runtime = runtimes["llama"]
    strategy = create_strategy("mean", runtime)
    readout = TracedReadout(runtime, lambda batch: strategy.readout(batch, ()))
    one, longer = (Batch.single(torch.tensor([ids])) for ids in ([7], [7, 11, 13, 17, 19]))
    for batch in (one, one, longer, longer):
        torch.testing.assert_close(readout(batch), strategy.readout(batch, ()), rtol=0, atol=0)
    assert readout.trace is not None and readout.calls == 2  # traced on the longer row, replayed once


def test_settling_records_the_trace_a_servers_first_query_then_replays(runtimes):
    """`serve`, `mcp` and the daemon settle an index's readout before users' queries need it: the
    first user query is already a replay, equal to the eager readout; a strategy without a traced
    readout (htp) is left alone."""
    strategy = create_strategy("mean", runtimes["llama"])
    settle(strategy)
    assert strategy.one_row.trace is not None and strategy.one_row.calls == SETTLING_CALLS
    np.testing.assert_array_equal(strategy.encode([TEXTS[3]], "query")[0], eager_vector(strategy, TEXTS[3]))
    assert strategy.one_row.calls == SETTLING_CALLS + 1
    untraced = create_strategy("htp", runtimes["llama"])
    settle(untraced)
    assert untraced.one_row is None
