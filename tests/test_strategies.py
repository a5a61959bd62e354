"""Every strategy's vector equals an independent computation from a plain transformers forward."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies import REGISTRY, create_strategy
from ragidx.indexer.strategies.base import preprocess_for_prompt
from tests.support.model_checks import ONE_PER_MECHANISM, plain_final_states, unit
from tests.support.tiny_models import DECODERS

TEXTS = [
    "A heat pump moves heat instead of making it.",
    'The keeper said "wind the clockwork" every night?',
    "Tides come twice a day because the Moon pulls the near-side ocean more strongly than the planet's "
    "centre, and the centre more strongly than the far side, so the water forms two bulges that the "
    "coast passes through as the Earth turns; spring tides follow new and full moons.",
    "Short.",
]


@pytest.mark.parametrize("arch", DECODERS)
def test_mean_last_and_prompteol_match_plain_forward(arch, runtimes, plain_models):
    model, tokenizer = plain_models[arch]
    for text in TEXTS:
        states = plain_final_states(model, tokenizer, text)
        quoted = 'This sentence : "' + preprocess_for_prompt(text) + '" means in one word:"'
        expected = {
            "mean": unit(states.mean(dim=0)),
            "last": unit(states[-1]),
            "prompteol": unit(plain_final_states(model, tokenizer, quoted)[-1]),
        }
        for name, vector in expected.items():
            got = create_strategy(name, runtimes[arch]).encode([text], "document")[0]
            np.testing.assert_allclose(got, vector, atol=1e-4, err_msg=f"{arch} {name}")


def test_mean_on_encoder_is_sentence_transformers_mean_pooling(runtimes, plain_models):
    model, tokenizer = plain_models["bert"]
    for text in TEXTS:
        expected = unit(plain_final_states(model, tokenizer, text).mean(dim=0))
        np.testing.assert_allclose(
            create_strategy("mean", runtimes["bert"]).encode([text])[0], expected, atol=1e-4
        )


@pytest.mark.parametrize("arch", [*DECODERS, "bert"])
def test_batch_invariance(arch, runtimes):
    """Every strategy on Llama and BERT; on the other decoders, one per mechanism and a last-token
    readout (padding is per mechanism; the variants within one differ in templates only)."""
    names = [n for n, cls in REGISTRY.items() if arch != "bert" or not cls.decoder_only]
    if arch not in ("llama", "bert"):
        names = [*ONE_PER_MECHANISM, "prompteol"]
    texts = [TEXTS[2], TEXTS[3], TEXTS[0] * 6, TEXTS[1]]
    for name in names:
        strategy = create_strategy(name, runtimes[arch])
        together = strategy.encode(texts)
        alone = np.stack([strategy.encode([t])[0] for t in texts])
        np.testing.assert_allclose(together, alone, atol=1e-4, err_msg=f"{arch} {name}")


def test_vectors_are_unit_float32_in_input_order(runtimes):
    strategy = create_strategy("mean", runtimes["qwen2"])
    vectors = strategy.encode(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), strategy.dimension)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors[2], strategy.encode([TEXTS[2]])[0], atol=1e-5)


def test_prompt_preprocessing_follows_the_authors_code():
    assert preprocess_for_prompt("  a cat sits ") == "a cat sits."
    assert preprocess_for_prompt('he said "hi"') == "he said 'hi'"
    assert preprocess_for_prompt("is it raining?") == "is it raining."
    assert preprocess_for_prompt("it's 'quoted'") == "it's 'quoted'"
    assert preprocess_for_prompt("") == "."


def test_queries_and_documents_use_their_own_templates(runtimes, plain_models):
    model, tokenizer = plain_models["llama"]
    strategy = create_strategy("last", runtimes["llama"], query_template="Query: {text}")
    expected = unit(plain_final_states(model, tokenizer, "Query: " + TEXTS[0])[-1])
    np.testing.assert_allclose(strategy.encode([TEXTS[0]], "query")[0], expected, atol=1e-4)
    assert strategy.params["query_template"] == "Query: {text}"
    assert strategy.params["document_template"] == "{text}"


def test_over_long_text_is_cut_inside_the_template(runtimes):
    strategy = create_strategy("prompteol", runtimes["qwen2"], max_length=24)
    ids = strategy.token_ids(TEXTS[2] * 3, "document")
    suffix = runtimes["qwen2"].tokenizer('" means in one word:"', add_special_tokens=False)["input_ids"]
    assert len(ids) <= 24 and ids[-len(suffix) :] == suffix
    assert strategy.truncated == 1


def test_decoder_strategies_refuse_an_encoder(runtimes):
    with pytest.raises(RagidxError, match=r"decoder-only.*--strategy mean"):
        create_strategy("prompteol", runtimes["bert"])


def test_unknown_strategy_and_bad_template_are_refused(runtimes):
    with pytest.raises(RagidxError, match=r"unknown strategy 'nope'.*mean"):
        create_strategy("nope", runtimes["qwen2"])
    with pytest.raises(RagidxError, match=r"\{text\} exactly once"):
        create_strategy("mean", runtimes["qwen2"], document_template="no slot")


@pytest.mark.parametrize("name", ["htp", "cp", "kv-embedding"])
def test_threads_embedding_at_once_get_what_each_would_alone(runtimes, name):
    """Strategies hook the model for the length of their forwards (these re-route its attention or
    states): threads sharing a model take turns, and none gets another's vector or its error."""
    strategy = create_strategy(name, runtimes["llama"])
    texts = [f"{text} ({n})" for n in range(8) for text in TEXTS]
    alone = {text: strategy.encode([text])[0] for text in texts}
    got, errors = {}, []

    def embed(part: list[str]) -> None:
        try:
            for text in part:
                got[text] = strategy.encode([text])[0]
        except Exception as error:  # what a thread raised is the failure to report
            errors.append(error)

    threads = [threading.Thread(target=embed, args=(texts[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[0]
    for text in texts:
        np.testing.assert_allclose(got[text], alone[text], atol=1e-5, err_msg=text)
