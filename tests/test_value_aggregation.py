"""VA, WVA and AlignedWVA against attention recomputed by hand from each layer's input and weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, Qwen3Config

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies import create_strategy
from ragidx.indexer.strategies.base import preprocess_for_prompt
from ragidx.indexer.strategies.layers import layer_set, parse_layers
from ragidx.indexer.strategies.value_aggregation import PAPER_LAYER_SETS, RELATIVE_DEPTH
from tests.support.tiny_models import DECODERS

TEXTS = [
    "A heat pump moves heat instead of making it.",
    "Lighthouse keepers wound the clockwork that turned the lens every few hours through the night, "
    "trimmed the wicks, cleaned the glass of soot and salt, and wrote the weather into the log.",
]
FUTUREEOL = "Forecasting the subsequent tokens {text} in one word:"


def rms_norm(x: torch.Tensor, norm: torch.nn.Module, gemma: bool) -> torch.Tensor:
    eps = getattr(norm, "variance_epsilon", None) or norm.eps
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + norm.weight) if gemma else y * norm.weight


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of [heads, tokens, dim] at positions 0..tokens-1 (rotate-half layout)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    rotated = torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], dim=-1)
    return x * cos + rotated * sin


def rope_theta(config, index: int) -> float:
    """The RoPE base of layer ``index``: one for the model, or one per layer type (Gemma 3)."""
    parameters = config.rope_parameters
    if "rope_theta" not in parameters:
        parameters = parameters[config.layer_types[index]]
    return parameters["rope_theta"]


def reference(layer: torch.nn.Module, config, index: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean value vector, last-token weighted values and their o_proj image, for one sequence x [T, D]."""
    attn, gemma = layer.self_attn, config.model_type.startswith("gemma")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    tokens = x.shape[0]
    h = rms_norm(x, layer.input_layernorm, gemma)
    q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(tokens, heads, head_dim).transpose(0, 1)
    k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(tokens, kv_heads, head_dim).transpose(0, 1)
    v_flat = F.linear(h, attn.v_proj.weight, attn.v_proj.bias)
    v = v_flat.view(tokens, kv_heads, head_dim).transpose(0, 1)
    if config.model_type in ("qwen3", "gemma3_text"):
        q, k = rms_norm(q, attn.q_norm, gemma), rms_norm(k, attn.k_norm, gemma)
    theta = rope_theta(config, index)
    q, k = rope(q, theta), rope(k, theta)
    scale = config.query_pre_attn_scalar**-0.5 if gemma else head_dim**-0.5
    last, positions = tokens - 1, torch.arange(tokens)
    visible = positions <= last
    if getattr(config, "layer_types", None) and config.layer_types[index] == "sliding_attention":
        visible &= positions > last - config.sliding_window
    outputs = []
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = (k[kv] @ q[head, last]) * scale
        if getattr(config, "attn_logit_softcapping", None):
            scores = torch.tanh(scores / config.attn_logit_softcapping) * config.attn_logit_softcapping
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        outputs.append(weights @ v[kv])
    weighted = torch.cat(outputs)
    aligned = F.linear(weighted, attn.o_proj.weight, attn.o_proj.bias)
    return {
        "va": v_flat.mean(dim=0),
        "wva": weighted,
        # Gemma normalises the attention output before the residual add: aligned-wva reads it after.
        "aligned-wva": rms_norm(aligned, layer.post_attention_layernorm, gemma) if gemma else aligned,
        "aligned-wva before norm": aligned,
    }


def layer_inputs(model, tokenizer, text: str, layers: list[int]) -> dict[int, torch.Tensor]:
    """Hidden states entering each of ``layers`` in a plain forward of one unpadded sequence."""
    seen: dict[int, torch.Tensor] = {}

    def record(index: int):
        def hook(module, args, kwargs) -> None:
            seen[index] = (args[0] if args else kwargs["hidden_states"])[0]

        return hook

    hooks = [model.layers[i].register_forward_pre_hook(record(i), with_kwargs=True) for i in layers]
    with torch.no_grad():
        model(**tokenizer(text, return_tensors="pt"))
    for hook in hooks:
        hook.remove()
    return seen


def expected_vector(arch, plain_models, name, text, template, layers, normalize=False) -> np.ndarray:
    model, tokenizer = plain_models[arch]
    inputs = layer_inputs(model, tokenizer, template.replace("{text}", text), layers)
    with torch.no_grad():
        per_layer = torch.stack(
            [reference(model.layers[i], model.config, i, inputs[i])[name] for i in layers]
        )
    if normalize:
        per_layer = F.normalize(per_layer, dim=-1)
    vector = per_layer.mean(dim=0).double().numpy()
    return vector / np.linalg.norm(vector)


@pytest.mark.parametrize("arch", DECODERS)
@pytest.mark.parametrize("name", ["aligned-wva", "wva", "va"])
def test_matches_attention_recomputed_from_weights(arch, name, runtimes, plain_models):
    strategy = create_strategy(name, runtimes[arch])
    assert strategy.layers == [
        4,
        5,
    ]  # round(0.65 * 6) .. round(0.85 * 6), or .. 5 (L - 1) for aligned-wva
    for text in TEXTS:
        if name == "va":
            expected = expected_vector(arch, plain_models, name, text, "{text}", strategy.layers)
        else:
            expected = expected_vector(
                arch, plain_models, name, preprocess_for_prompt(text), FUTUREEOL, strategy.layers
            )
        np.testing.assert_allclose(strategy.encode([text])[0], expected, atol=1e-4, err_msg=f"{arch} {name}")


@pytest.mark.parametrize("arch", ["qwen2", "gemma2", "gemma3_text"])
def test_other_layers_prompt_and_per_layer_normalisation(arch, runtimes, plain_models):
    strategy = create_strategy(
        "aligned-wva", runtimes[arch], layers="0,2-3", prompt="prompteol", normalize_layers=True
    )
    template = 'This sentence : "{text}" means in one word:"'
    text = preprocess_for_prompt(TEXTS[1])
    expected = expected_vector(arch, plain_models, "aligned-wva", text, template, [0, 2, 3], normalize=True)
    np.testing.assert_allclose(strategy.encode([TEXTS[1]])[0], expected, atol=1e-4)


def test_dimensions_follow_the_readout(runtimes):
    runtime = runtimes["llama"]  # 4 heads of 16, 2 KV heads, hidden 64
    assert create_strategy("va", runtime).encode(["x"]).shape == (1, 32)
    assert create_strategy("wva", runtime).encode(["x"]).shape == (1, 64)
    assert create_strategy("aligned-wva", runtime).encode(["x"]).shape == (1, 64)


def test_early_exit_after_the_last_layer_of_the_set(runtimes):
    runtime = runtimes["mistral"]
    calls: list[int] = []
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, i=i: calls.append(i))
        for i, layer in enumerate(runtime.arch.layers)
    ]
    try:
        create_strategy("aligned-wva", runtime, layers="1-2").encode(["One text.", "Another, longer text."])
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [0, 1, 2]


def test_query_instruction_sits_inside_the_template(runtimes, plain_models):
    strategy = create_strategy("aligned-wva", runtimes["qwen3"], query_instruction="Find the passage about:")
    assert (
        strategy.query_template
        == "Forecasting the subsequent tokens Find the passage about: {text} in one word:"
    )
    assert strategy.document_template == FUTUREEOL
    template = strategy.query_template
    expected = expected_vector(
        "qwen3", plain_models, "aligned-wva", preprocess_for_prompt(TEXTS[0]), template, [4, 5]
    )
    np.testing.assert_allclose(strategy.encode([TEXTS[0]], "query")[0], expected, atol=1e-4)
    assert strategy.params["query_instruction"] == "Find the passage about:"


def test_stored_params_rebuild_the_same_strategy(runtimes):
    first = create_strategy("wva", runtimes["qwen2"], layers="1,3", query_instruction="Q:")
    again = create_strategy("wva", runtimes["qwen2"], **first.params)
    assert again.params == first.params
    np.testing.assert_array_equal(first.encode(["same text"], "query"), again.encode(["same text"], "query"))


def default_layer_set(config, depth=RELATIVE_DEPTH):
    """The value-aggregation strategies' layers for a model when --layers is not given."""
    return layer_set(None, config, config.num_hidden_layers, PAPER_LAYER_SETS, depth)


def test_paper_layer_sets_are_recognised_from_the_config():
    llama2 = LlamaConfig(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008, vocab_size=32000)
    assert default_layer_set(llama2) == (list(range(20, 28)), "paper (Llama-2-7B)")
    qwen3 = Qwen3Config(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288)
    assert default_layer_set(qwen3) == ([26, 27, 29, 30, 31], "paper (Qwen3-8B)")
    other = Qwen3Config(hidden_size=1024, num_hidden_layers=28)
    assert default_layer_set(other) == (list(range(18, 25)), "relative depth 0.65-0.85")
    assert default_layer_set(other, (0.65, 1.0)) == (list(range(18, 28)), "relative depth 0.65-1.00")
    assert default_layer_set(llama2, (0.65, 1.0))[0] == list(range(20, 28))  # the paper's set still wins


def test_layer_specifications():
    assert parse_layers("20-27", 32) == list(range(20, 28))
    assert parse_layers("26,27,29", 32) == [26, 27, 29]
    assert parse_layers("1-3, 7,2", 8) == [1, 2, 3, 7]
    for spec, message in [
        ("", "no layer"),
        ("5-2", "backwards"),
        ("a-b", "numbers"),
        ("0-40", r"layers \[32"),
    ]:
        with pytest.raises(RagidxError, match=message):
            parse_layers(spec, 32)


def test_options_are_checked(runtimes):
    with pytest.raises(RagidxError, match="--layers does not apply to strategy 'mean'"):
        create_strategy("mean", runtimes["qwen2"], layers="1")
    with pytest.raises(RagidxError, match="unknown --prompt 'poem'"):
        create_strategy("aligned-wva", runtimes["qwen2"], prompt="poem")
    with pytest.raises(RagidxError, match="model has layers 0-5"):
        create_strategy("va", runtimes["qwen2"], layers="6")


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text"])
def test_gemma_attention_output_before_its_norm_and_older_indexes(arch, runtimes, plain_models):
    """``attention_norm="before"`` reads Gemma's attention output before post_attention_layernorm,
    which is what an index stored without the parameter was built with."""
    from ragidx.indexer.strategies import strategy_from_index

    after = create_strategy("aligned-wva", runtimes[arch])
    stored = {key: value for key, value in after.params.items() if key != "attention_norm"}
    older = strategy_from_index("aligned-wva", runtimes[arch], stored)
    assert (after.options.attention_norm, older.options.attention_norm) == ("after", "before")
    text = preprocess_for_prompt(TEXTS[0])
    expected = expected_vector(arch, plain_models, "aligned-wva before norm", text, FUTUREEOL, older.layers)
    np.testing.assert_allclose(older.encode([TEXTS[0]])[0], expected, atol=1e-4)
    assert np.abs(older.encode([TEXTS[0]])[0] - after.encode([TEXTS[0]])[0]).max() > 1e-3
