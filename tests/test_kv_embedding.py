"""KV-Embedding against independent computations from the models' weights (methods.md §5, §8)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch

from ragidx.indexer.model.runtime import ModelRuntime
from ragidx.indexer.strategies import create_strategy
from ragidx.indexer.strategies.base import render
from ragidx.indexer.strategies.kv_embedding import KV_DOCUMENT_TEMPLATE, KV_QUERY_TEMPLATE
from ragidx.indexer.strategies.kv_rerouting import REROUTING_ATTRIBUTE
from tests.support.tiny_models import DECODERS, save_tiny_model

TEXTS = [
    "Tides rise twice a day.",
    "The keeper climbed the tower every night to light the lamp, and ships passed the rocks safely.",
    "Compost needs air, water and time.",
]


@pytest.fixture(scope="module")
def mha_llama(tmp_path_factory, tiny_models):
    """A Llama with as many KV heads as query heads (plain multi-head attention), loaded by ragidx."""
    from ragidx.indexer.model.runtime import load_runtime
    from tests.support.tiny_models import train_tokenizer

    folder = tmp_path_factory.mktemp("mha") / "llama"
    save_tiny_model("llama", folder, train_tokenizer(), seed=3, overrides={"num_key_value_heads": 4})
    return load_runtime(str(folder), device="cpu", dtype="float32")


def runtime_for(name, runtimes, mha_llama) -> ModelRuntime:
    return mha_llama if name == "llama-mha" else runtimes[name]


def plain_vector(model, tokenizer, text: str, template: str) -> np.ndarray:
    """½(last + mean) of a plain forward's final hidden states, L2-normalised: the prompt-only vector."""
    ids = tokenizer(render(template, text), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        states = model(input_ids=ids).last_hidden_state[0]
    vector = 0.5 * (states[-1] + states.mean(dim=0))
    return (vector / vector.norm()).numpy()


@pytest.mark.parametrize("arch", DECODERS)
@pytest.mark.parametrize("role", ["document", "query"])
def test_bias_minus_infinity_is_the_prompt_only_vector(arch, role, runtimes, plain_models):
    strategy = create_strategy("kv-embedding", runtimes[arch], kv_bias=-math.inf, layers="0-5")
    model, tokenizer = plain_models[arch]
    template = KV_DOCUMENT_TEMPLATE if role == "document" else KV_QUERY_TEMPLATE
    expected = np.stack([plain_vector(model, tokenizer, text, template) for text in TEXTS])
    np.testing.assert_allclose(strategy.encode(TEXTS, role), expected, atol=1e-5)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def independent_attention(attention, hidden, cos, sin, real, bias: float | None) -> torch.Tensor:
    """The attention block's output computed from its weights with plain tensors.

    ``real`` [B, T] marks real tokens; ``bias`` None means plain causal attention, otherwise each
    row's last real key/value is prepended with ``bias`` added to its logit.
    """
    config = attention.config
    batch, length, _ = hidden.shape
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, attention.head_dim

    def project(linear, count, norm):
        states = linear(hidden).view(batch, length, count, dim)
        return (norm(states) if norm is not None else states).transpose(1, 2)

    q = project(attention.q_proj, heads, getattr(attention, "q_norm", None))
    k = project(attention.k_proj, kv_heads, getattr(attention, "k_norm", None))
    v = project(attention.v_proj, kv_heads, None)
    q = q * cos[:, None] + rotate_half(q) * sin[:, None]
    k = k * cos[:, None] + rotate_half(k) * sin[:, None]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    positions = torch.arange(length)
    allowed = (positions[None, :] <= positions[:, None])[None] & real[:, None, :].bool()
    window = getattr(attention, "sliding_window", None)
    if window:
        allowed &= (positions[:, None] - positions[None, :] < window)[None]
    softcap = getattr(config, "attn_logit_softcapping", None)

    def logits(keys):
        scores = q @ keys.transpose(2, 3) * attention.scaling
        return torch.tanh(scores / softcap) * softcap if softcap else scores

    scores = logits(k).masked_fill(~allowed[:, None], -math.inf)
    if bias is not None:
        last = torch.tensor([int(np.flatnonzero(row)[-1]) for row in real.numpy()])
        k_n = k[torch.arange(batch), :, last].unsqueeze(2)
        v_n = v[torch.arange(batch), :, last].unsqueeze(2)
        scores = torch.cat([logits(k_n) + bias, scores], dim=-1)
        v = torch.cat([v_n, v], dim=2)
    weights = torch.softmax(scores, dim=-1)
    return attention.o_proj((weights @ v).transpose(1, 2).reshape(batch, length, heads * dim))


def recorded_attention(strategy, texts, padding_side="right") -> tuple[dict, torch.Tensor]:
    """Run the strategy on one padded batch, keeping each attention block's input and output.

    Returns, per layer, the block's input hidden states, its RoPE tables and its output, and the
    batch's real-token mask.
    """
    runtime = strategy.runtime
    prepared = strategy.prepare(texts, "document", None)
    batch = runtime.pad([row.ids for row in prepared], list(range(len(texts))), padding_side=padding_side)
    stores: dict[int, dict] = {layer: {} for layer in range(runtime.arch.num_layers)}

    def before(store, module, args, kwargs):
        store["hidden"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        store["cos"], store["sin"] = kwargs["position_embeddings"]

    def after(store, module, args, kwargs, output):
        store["output"] = output[0]

    handles = []
    for layer, store in stores.items():
        attention = runtime.arch.attention(layer)
        handles.append(attention.register_forward_pre_hook(partial(before, store), with_kwargs=True))
        handles.append(attention.register_forward_hook(partial(after, store), with_kwargs=True))
    try:
        strategy.readout(batch, prepared)
    finally:
        for handle in handles:
            handle.remove()
    return stores, batch.attention_mask.bool()


def recomputed(runtime, layer: int, store: dict, real: torch.Tensor, bias: float | None) -> torch.Tensor:
    with torch.no_grad():
        return independent_attention(
            runtime.arch.attention(layer), store["hidden"], store["cos"], store["sin"], real, bias
        )


@pytest.mark.parametrize("arch", [*DECODERS, "llama-mha"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_attention_at_each_layer_equals_an_independent_computation(arch, padding_side, runtimes, mha_llama):
    runtime = runtime_for(arch, runtimes, mha_llama)
    strategy = create_strategy("kv-embedding", runtime, layers="2,4")
    stores, real = recorded_attention(strategy, TEXTS, padding_side)
    for layer, store in stores.items():
        bias = strategy.options.kv_bias if layer in strategy.layers else None
        expected = recomputed(runtime, layer, store, real, bias)
        torch.testing.assert_close(store["output"][real], expected[real], atol=2e-5, rtol=1e-4)


def test_rerouting_changes_exactly_the_selected_layers(runtimes):
    """Same records, but the independent computation with the wrong choice must not match."""
    runtime = runtimes["qwen3"]
    stores, real = recorded_attention(create_strategy("kv-embedding", runtime, layers="3"), TEXTS[1:])
    for layer, wrong_bias in ((2, 1.0), (3, None)):
        wrong = recomputed(runtime, layer, stores[layer], real, wrong_bias)
        assert (stores[layer]["output"][real] - wrong[real]).abs().max() > 1e-3


def first_sentence_states(runtime, strategy, texts):
    """Final-layer states (post-norm) of the tokens both texts share at their start."""
    prepared = strategy.prepare(texts, "document", None)
    common = next(i for i, (a, b) in enumerate(zip(*(row.ids for row in prepared), strict=False)) if a != b)
    with runtime.capture(runtime.arch.final_norm) as states:
        strategy.encode(texts)
    by_length = sorted(range(2), key=lambda i: -len(prepared[i].ids))
    rows = {index: states[0][position] for position, index in enumerate(by_length)}
    return rows[0][: common - 1], rows[1][: common - 1]


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3_text"])
def test_first_sentence_sees_a_change_in_the_last(arch, runtimes):
    runtime = runtimes[arch]
    texts = [
        "The tide comes in slowly. Boats wait in the harbour.",
        "The tide comes in slowly. Espresso needs fine coffee.",
    ]
    plain = first_sentence_states(runtime, create_strategy("kv-embedding", runtime, kv_bias=-math.inf), texts)
    torch.testing.assert_close(plain[0], plain[1], atol=1e-5, rtol=0)
    rerouted = first_sentence_states(runtime, create_strategy("kv-embedding", runtime), texts)
    assert (rerouted[0] - rerouted[1]).abs().max() > 1e-3


@pytest.mark.parametrize("arch", [*DECODERS, "llama-mha"])
def test_batch_invariance_with_either_padding_side(arch, runtimes, mha_llama):
    runtime = runtime_for(arch, runtimes, mha_llama)
    strategy = create_strategy("kv-embedding", runtime)
    alone = np.stack([strategy.encode([text])[0] for text in TEXTS])
    np.testing.assert_allclose(strategy.encode(TEXTS), alone, atol=1e-5)
    prepared = strategy.prepare(TEXTS, "document", None)
    left = runtime.pad([row.ids for row in prepared], [0, 1, 2], padding_side="left")
    vectors = strategy.readout(left, prepared).numpy()
    np.testing.assert_allclose(vectors / np.linalg.norm(vectors, axis=1, keepdims=True), alone, atol=1e-5)


def test_sdpa_and_eager_models_give_the_same_vectors(tiny_models, runtimes):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_models["qwen2"], dtype=torch.float32, attn_implementation="eager")
    eager = ModelRuntime(model.eval(), runtimes["qwen2"].tokenizer, "eager-qwen2")
    sdpa_runtime = runtimes["qwen2"]
    assert sdpa_runtime.model.config._attn_implementation == "sdpa"
    vectors = {
        name: create_strategy("kv-embedding", runtime).encode(TEXTS)
        for name, runtime in (("eager", eager), ("sdpa", sdpa_runtime))
    }
    np.testing.assert_allclose(vectors["eager"], vectors["sdpa"], atol=1e-5)


def test_the_model_is_restored_for_other_strategies(runtimes):
    runtime = runtimes["mistral"]
    mean = create_strategy("mean", runtime)
    before = mean.encode(TEXTS)
    create_strategy("kv-embedding", runtime).encode(TEXTS)
    assert runtime.model.config._attn_implementation == "sdpa"
    assert not any(hasattr(runtime.arch.attention(i), REROUTING_ATTRIBUTE) for i in range(6))
    np.testing.assert_array_equal(mean.encode(TEXTS), before)


def test_layer_set_sources(runtimes):
    from transformers import Qwen3Config

    from ragidx.indexer.strategies.kv_embedding import PAPER_LAYER_SETS
    from ragidx.indexer.strategies.paper_models import paper_layers

    qwen3_4b = Qwen3Config(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728)
    assert paper_layers(qwen3_4b, PAPER_LAYER_SETS) == (list(range(12, 22)), "paper (Qwen3-4B)")
    assert paper_layers(Qwen3Config(), PAPER_LAYER_SETS) is None
    strategy = create_strategy("kv-embedding", runtimes["llama"])
    assert strategy.layers == [2, 3, 4]  # round(0.35·6) .. round(0.6·6), nothing cached
    assert strategy.layer_source.startswith("fallback")
    given = create_strategy("kv-embedding", runtimes["llama"], layers="1,5")
    assert (given.layers, given.layer_source, given.params["kv_bias"]) == ([1, 5], "--layers", 1.0)


def test_bad_options_are_refused(runtimes):
    from ragidx.indexer.errors import RagidxError

    with pytest.raises(RagidxError, match="kv-bias"):
        create_strategy("kv-embedding", runtimes["qwen2"], kv_bias=math.nan)
    with pytest.raises(RagidxError, match="layers"):
        create_strategy("kv-embedding", runtimes["qwen2"], layers="4-9")
    with pytest.raises(RagidxError, match="decoder"):
        create_strategy("kv-embedding", runtimes["bert"])
