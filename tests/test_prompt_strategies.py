"""cot, knowledge, the in-context demo, Contrastive Prompting and echo against plain forwards,
with CP's intervention done by a hook written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies import REGISTRY, create_strategy
from ragidx.indexer.strategies.base import preprocess_for_prompt
from ragidx.indexer.strategies.contrastive import default_settings, intervene
from ragidx.indexer.strategies.paper_models import LLAMA2_7B, LLAMA3_8B
from tests.support.model_checks import plain_final_states, unit
from tests.support.tiny_models import DECODERS

TEXTS = [
    "A heat pump moves heat instead of making it.",
    'The keeper said "wind the clockwork" every night?',
]
EOL = 'This sentence : "{}" means in one word:"'
COT = 'After thinking step by step , this sentence : "{}" means in one word:"'
KNOWLEDGE = (
    "The essence of a sentence is often captured by its main subjects and actions, while descriptive "
    "terms provide additional but less central details. With this in mind , this sentence : "
    '"{}" means in one word:"'
)
AUX = 'The irrelevant information of this sentence : "{}" means in one word:"'


@pytest.mark.parametrize("arch", DECODERS)
def test_prompt_variants_read_the_last_token_of_the_exact_strings(arch, runtimes, plain_models):
    model, tokenizer = plain_models[arch]
    demo = 'This sentence : "A jockey riding a horse." means in one word:"Equestrian".'
    cases = {
        ("cot", None): COT,
        ("knowledge", None): KNOWLEDGE,
        ("prompteol", "A jockey riding a horse.=>Equestrian"): demo + EOL,
    }
    for (name, icl_demo), template in cases.items():
        options = {"icl_demo": icl_demo} if icl_demo else {}
        strategy = create_strategy(name, runtimes[arch], **options)
        for text in TEXTS:
            prompt = template.format(preprocess_for_prompt(text))
            expected = unit(plain_final_states(model, tokenizer, prompt)[-1])
            np.testing.assert_allclose(
                strategy.encode([text])[0], expected, atol=1e-4, err_msg=f"{arch} {name}"
            )


def o_proj_input_at_last_token(model, tokenizer, prompt: str, layer: int) -> torch.Tensor:
    seen = []
    handle = model.layers[layer].self_attn.o_proj.register_forward_pre_hook(
        lambda module, args: seen.append(args[0][0, -1].clone())
    )
    try:
        plain_final_states(model, tokenizer, prompt)
    finally:
        handle.remove()
    return seen[0]


def contrasted_state(model, tokenizer, prompt: str, aux: torch.Tensor, layer: int, output: int, mode, alpha):
    """The normal prompt's forward with the last token's o_proj input replaced at ``layer``."""

    def replace(module, args):
        x = args[0].clone()
        a = x[0, -1]
        d = a - aux
        x[0, -1] = alpha * d if mode == "ns" else d * a.norm() / d.norm()
        return (x,)

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    handle = model.layers[layer].self_attn.o_proj.register_forward_pre_hook(replace)
    try:
        with torch.no_grad():
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
    finally:
        handle.remove()
    return states[output + 1][0, -1]


@pytest.mark.parametrize("arch", DECODERS)
def test_cp_equals_an_independent_two_pass_computation(arch, runtimes, plain_models):
    model, tokenizer = plain_models[arch]
    for prompt, mode, alpha, layer, output in (
        ("prompteol", "ns", 0.5, 1, 4),
        ("prompteol", "nr", 0.5, 2, 3),
        ("cot+knowledge", "ns", 2.0, 1, 4),
    ):
        strategy = create_strategy(
            "cp",
            runtimes[arch],
            prompt=prompt,
            cp_mode=mode,
            cp_alpha=alpha,
            cp_layer=layer,
            output_layer=output,
        )
        templates = {"prompteol": EOL, "cot": COT, "knowledge": KNOWLEDGE}
        for text in TEXTS:
            quoted = preprocess_for_prompt(text)
            aux = o_proj_input_at_last_token(model, tokenizer, AUX.format(quoted), layer)
            readings = [
                contrasted_state(
                    model, tokenizer, templates[p].format(quoted), aux, layer, output, mode, alpha
                )
                for p in prompt.split("+")
            ]
            expected = unit(torch.stack(readings).mean(dim=0))
            np.testing.assert_allclose(
                strategy.encode([text])[0], expected, atol=1e-4, err_msg=f"{arch} {prompt} {mode}"
            )


def test_nr_keeps_the_norm_of_the_intervened_vector(runtimes):
    a, b = torch.randn(3, 16), torch.randn(3, 16)
    np.testing.assert_allclose(intervene(a, b, "nr", 0.5).norm(dim=-1), a.norm(dim=-1), rtol=1e-5)
    runtime = runtimes["qwen3"]
    strategy = create_strategy("cp", runtime, cp_mode="nr")
    o_proj = runtime.arch.attention(strategy.cp_layer).o_proj
    before, after = [], []
    first = o_proj.register_forward_pre_hook(lambda m, args: before.append(args[0][0, -1].clone()))
    second = o_proj.register_forward_hook(lambda m, args, out: after.append(args[0][0, -1].clone()))
    try:
        strategy.encode([TEXTS[0]])
    finally:
        first.remove()
        second.remove()
    # calls: the auxiliary pass, then the normal pass (which is intervened on)
    assert torch.allclose(after[0], before[0]) and not torch.allclose(after[1], before[1])
    assert float(after[1].norm()) == pytest.approx(float(before[1].norm()), rel=1e-5)


@pytest.mark.parametrize("arch", DECODERS)
def test_ns_with_alpha_one_and_a_zero_auxiliary_vector_is_the_plain_prompt(
    arch, runtimes, plain_models, monkeypatch
):
    model, tokenizer = plain_models[arch]
    strategy = create_strategy("cp", runtimes[arch], cp_alpha=1.0, output_layer=3)
    monkeypatch.setattr(strategy, "auxiliary_vectors", lambda batch: torch.zeros(len(batch.indices), 64))
    ids = tokenizer(EOL.format(preprocess_for_prompt(TEXTS[0])), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = unit(model(input_ids=ids, output_hidden_states=True).hidden_states[4][0, -1])
    np.testing.assert_allclose(strategy.encode([TEXTS[0]])[0], expected, atol=1e-4)


def test_auxiliary_pass_runs_exactly_l_plus_one_layers(runtimes):
    runtime = runtimes["mistral"]
    for layer in (1, 3):
        strategy = create_strategy("cp", runtime, cp_layer=layer, output_layer=4, prompt="cot+knowledge")
        rows = strategy.prepare([TEXTS[0]], "document", None)
        runtime.layers_run = 0
        strategy.auxiliary_vectors(runtime.pad([rows[0].auxiliary], [0]))
        assert runtime.layers_run == layer + 1
        runtime.layers_run = 0
        strategy.encode(TEXTS)  # one batch: one auxiliary pass for both normal prompts
        assert runtime.layers_run == (layer + 1) + 2 * (4 + 1)


def test_cp_defaults_follow_the_code(runtimes):
    assert default_settings(LlamaConfig(**LLAMA2_7B))[0] == (4, 0.5, 26)
    assert default_settings(LlamaConfig(**LLAMA3_8B))[0] == (6, 0.25, 30)
    assert default_settings(LlamaConfig(num_hidden_layers=28))[0] == (4, 0.5, 23)
    strategy = create_strategy("cp", runtimes["llama"])
    assert (
        strategy.cp_layer,
        strategy.cp_alpha,
        strategy.output_layer,
        strategy.options.cp_mode,
    ) == (
        1,
        0.5,
        4,
        "ns",
    )
    assert strategy.params["aux_prompt"] == AUX.replace("{}", "{text}")


@pytest.mark.parametrize("arch", DECODERS)
def test_echo_pools_exactly_the_second_copy(arch, runtimes, plain_models):
    model, tokenizer = plain_models[arch]
    strategy = create_strategy("echo", runtimes[arch], query_instruction="Find the passage")

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    with_bos = tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id
    lead = [tokenizer.bos_token_id] if with_bos else []
    for role, pieces in (
        ("document", ("Document:", "\nDocument again:", "")),
        ("query", ("Instruct: Find the passage\nQuery:", "\nQuery again:", "")),
    ):
        for text in TEXTS:
            first = lead + tok(pieces[0]) + tok(text) + tok(pieces[1])
            ids = first + tok(text)
            with torch.no_grad():
                states = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            expected = unit(states[len(first) :].mean(dim=0))
            np.testing.assert_allclose(
                strategy.encode([text], role)[0], expected, atol=1e-4, err_msg=f"{arch} {role}"
            )


def test_prompt_sets_and_echo_are_batch_invariant(runtimes):
    texts = [TEXTS[0] * 5, "Short.", TEXTS[1]]
    for name, options in (("cp", {"prompt": "cot+knowledge", "cp_mode": "nr"}), ("echo", {})):
        strategy = create_strategy(name, runtimes["gemma2"], **options)
        together = strategy.encode(texts, "query")
        alone = np.stack([strategy.encode([t], "query")[0] for t in texts])
        np.testing.assert_allclose(together, alone, atol=1e-4, err_msg=name)


def test_bad_prompt_options_are_refused(runtimes):
    runtime = runtimes["llama"]
    for name, options, message in (
        ("cp", {"prompt": "cot+cot"}, "'\\+'-joined set"),
        ("cp", {"prompt": "futureeol"}, "prompteol, cot, knowledge"),
        ("cp", {"prompt": "cot+knowledge", "document_template": "{text}"}, "single --prompt"),
        ("cp", {"cp_layer": 4, "output_layer": 2}, "before the intervention layer"),
        ("cp", {"aux_prompt": "no slot"}, "exactly once"),
        ("prompteol", {"icl_demo": "no separator"}, "SENTENCE=>WORD"),
        ("echo", {"document_template": "once {text}"}, "exactly 2 times"),
        ("cot", {"icl_demo": "a=>b"}, "--icl-demo does not apply to strategy 'cot'"),
    ):
        with pytest.raises(RagidxError, match=message):
            create_strategy(name, runtime, **options)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_stored_params_recreate_the_same_strategy(name, runtimes):
    """An index stores ``params`` and rebuilds the strategy from them at query time."""
    options = {"cp": {"prompt": "cot+knowledge", "cp_mode": "nr"}}.get(name, {})
    first = create_strategy(name, runtimes["qwen2"], **options)
    again = create_strategy(name, runtimes["qwen2"], **first.params)
    assert again.params == first.params
    np.testing.assert_array_equal(again.encode(TEXTS, "query"), first.encode(TEXTS, "query"))
