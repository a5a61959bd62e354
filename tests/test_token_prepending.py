"""HTP and TP against independent computations: plain forwards, with the copies done by hooks
written here, on ids assembled here from the plain tokenizer."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.runtime import load_runtime
from ragidx.indexer.strategies import create_strategy
from ragidx.indexer.strategies.token_prepending import default_window
from tests.support.documents import spans_of
from tests.support.tiny_models import DECODERS, save_tiny_model, train_tokenizer

SENTENCES = [
    "The lighthouse stood on the rock.",
    "Its lamp turned all night.",
    "Ships passed the reef safely.",
]
TEXT = " ".join(SENTENCES)
QUERY_PREFIX = "Retrieve relevant document. Text:"


def expected_layout(tokenizer, sentences: list[str], pst: int, bpst: int, prefix: str = ""):
    """Ids as methods.md §6 lays them out, built from the plain tokenizer, and the pooled positions."""

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    # BOS first: the tokenizer's own, or the sink ragidx puts there when the tokenizer adds none.
    ids = [tokenizer.bos_token_id, *tok(prefix)] + [bpst] * len(sentences)
    pooled, psts, ends = [], [], []
    for sentence in sentences:
        psts.append(len(ids))
        ids.append(pst)
        pooled += range(len(ids), len(ids) + len(tok(sentence)))
        ids += tok(sentence)
        ends.append(len(ids) - 1)
    first_bpst = ids.index(bpst)
    bpsts = list(range(first_bpst, first_bpst + len(sentences)))
    return ids, pooled, psts, ends, bpsts


def plain_states(model, ids: list[int], placeholder_rows: dict[int, torch.Tensor], hooks=()):
    """Every layer's output of a plain forward; placeholder rows go in through inputs_embeds
    (scaled as Gemma scales every embedding row)."""
    embed = model.get_input_embeddings()
    scale = getattr(embed, "embed_scale", 1.0)
    known = [i if i < embed.num_embeddings else 0 for i in ids]
    inputs = embed(torch.tensor([known])).clone()
    for position, token in enumerate(ids):
        if token in placeholder_rows:
            inputs[0, position] = placeholder_rows[token] * scale
    handles = [model.layers[layer].register_forward_pre_hook(hook) for layer, hook in hooks]
    try:
        with torch.no_grad():
            out = model(inputs_embeds=inputs, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    return out.hidden_states  # [embeddings, output of layer 0, ...]


def mean_rows(model, known: int) -> torch.Tensor:
    return model.get_input_embeddings().weight[:known].mean(dim=0)


def unit(vector: torch.Tensor) -> np.ndarray:
    vector = vector.double().numpy()
    return vector / np.linalg.norm(vector)


def copy_hook(pairs: list[tuple[int, int]]):
    """A pre-hook that copies state[source] into state[target] for each pair, in order."""

    def hook(module, args):
        hidden = args[0].clone()
        for target, source in pairs:
            hidden[0, target] = hidden[0, source]
        return (hidden, *args[1:])

    return hook


@pytest.mark.parametrize("arch", DECODERS)
@pytest.mark.parametrize("role", ["document", "query"])
def test_htp_equals_an_independent_computation(arch, role, runtimes, plain_models):
    """With the window off: the plain masked mean over the text's tokens at the exit layer.
    With it on: the same forward with the copies made by this test's own hooks."""
    model, tokenizer = plain_models[arch]
    rows = {1000: mean_rows(model, 1000), 1001: mean_rows(model, 1000)}
    prefix = QUERY_PREFIX if role == "query" else ""
    ids, pooled, psts, ends, bpsts = expected_layout(tokenizer, SENTENCES, 1000, 1001, prefix)
    spans = [spans_of(TEXT, SENTENCES)]
    for window in ("1-1", "1-3"):
        strategy = create_strategy("htp", runtimes[arch], rewire=window, exit_layer=4)
        assert strategy.prepare([TEXT], role, spans)[0].ids == ids
        start, stop = (int(x) for x in window.split("-"))
        pairs = list(zip(psts, ends, strict=True)) + list(zip(bpsts, psts, strict=True))
        states = plain_states(model, ids, rows, [(layer, copy_hook(pairs)) for layer in range(start, stop)])
        expected = unit(states[5][0, pooled].mean(dim=0))
        got = strategy.encode([TEXT], role, sentences=spans)[0]
        np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=f"{arch} {role} {window}")


@pytest.mark.parametrize("arch", DECODERS)
def test_tp_equals_an_independent_computation(arch, runtimes, plain_models):
    model, tokenizer = plain_models[arch]
    rows = {1000: mean_rows(model, 1000)}
    lead = [tokenizer.bos_token_id]  # the tokenizer's own BOS, or the sink where it adds none
    text_ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    quoted = (
        tokenizer('This sentence : "', add_special_tokens=False)["input_ids"],
        tokenizer('" means in one word:"', add_special_tokens=False)["input_ids"],
    )
    cases = {
        "mean": ([*lead, 1000, *text_ids], range(len(lead) + 1, len(lead) + 1 + len(text_ids))),
        "last": (lead + quoted[0] + [1000] + text_ids + quoted[1], None),
    }
    for pool, (ids, pooled) in cases.items():
        strategy = create_strategy("tp", runtimes[arch], pool=pool, rewire="1-3", exit_layer=3)
        pst = ids.index(1000)
        hook = copy_hook([(pst, len(ids) - 1)])
        states = plain_states(model, ids, rows, [(1, hook), (2, hook)])[4][0]
        expected = unit(states[list(pooled)].mean(dim=0) if pooled else states[-1])
        np.testing.assert_allclose(strategy.encode([TEXT])[0], expected, atol=1e-4, err_msg=f"{arch} {pool}")


@pytest.mark.parametrize("arch", DECODERS)
@pytest.mark.parametrize("name", ["htp", "tp"])
def test_no_placeholder_ever_sits_at_the_attention_sink(arch, name, runtimes):
    strategy = create_strategy(name, runtimes[arch])
    for role in ("document", "query"):
        layout = strategy.prepare([TEXT], role, None)[0]
        assert 0 not in layout.summaries + layout.broadcasts, (arch, name, role)
    adds_bos = runtimes[arch].tokenizer("x")["input_ids"][0] == runtimes[arch].tokenizer.bos_token_id
    assert strategy.params["sink"] == ("none" if adds_bos else "bos")


def test_sink_choices_and_indexes_from_before_the_sink(runtimes):
    """qwen2's tokenizer adds no BOS: the sink is its BOS (auto), its EOS, or absent ("none",
    the layout of indexes built before the sink existed, which upgrade_params restores)."""
    from ragidx.indexer.strategies import strategy_from_index

    runtime = runtimes["qwen2"]
    tokenizer = runtime.tokenizer
    first = {
        sink: create_strategy("htp", runtime, sink=sink).prepare([TEXT], "document", None)[0].ids[0]
        for sink in ("auto", "bos", "eos", "none")
    }
    placeholder = create_strategy("htp", runtime).placeholders.broadcast_id
    assert first == {"auto": tokenizer.bos_token_id, "bos": tokenizer.bos_token_id,
                     "eos": tokenizer.eos_token_id, "none": placeholder}  # fmt: skip
    stored = {k: v for k, v in create_strategy("htp", runtime, sink="none").params.items() if k != "sink"}
    old = strategy_from_index("htp", runtime, stored)
    assert old.params["sink"] == "none" and old.prepare([TEXT], "document", None)[0].ids[0] == placeholder
    with pytest.raises(RagidxError, match="unknown --sink 'first'"):
        create_strategy("tp", runtime, sink="first")


def layer_inputs(runtime, strategy, text: str, layers: range) -> dict[int, torch.Tensor]:
    """The hidden states each layer actually works on (after any rewiring), via its input norm."""
    seen: dict[int, torch.Tensor] = {}
    handles = [
        runtime.arch.layers[layer].input_layernorm.register_forward_pre_hook(
            lambda module, args, layer=layer: seen.__setitem__(layer, args[0][0].clone())
        )
        for layer in layers
    ]
    try:
        strategy.encode([text])
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("arch", DECODERS)
def test_rewiring_copies_block_ends_then_summaries_inside_the_window_only(arch, runtimes):
    runtime = runtimes[arch]
    strategy = create_strategy("htp", runtime, rewire="1-3", exit_layer=4)
    layout = strategy.prepare([TEXT], "document", None)[0]
    assert len(layout.summaries) == len(SENTENCES)
    seen = layer_inputs(runtime, strategy, TEXT, range(1, 5))  # layer 0 sees raw embeddings
    for layer, states in seen.items():
        local = torch.allclose(states[layout.summaries], states[layout.sources])
        broadcast = torch.equal(states[layout.broadcasts], states[layout.summaries])
        assert local == broadcast == (1 <= layer < 3), (arch, layer)


@pytest.mark.parametrize("arch", DECODERS)
def test_later_sentences_reach_earlier_tokens_only_with_rewiring(arch, runtimes):
    runtime = runtimes[arch]
    other = TEXT.replace("Ships passed the reef safely.", "Gulls circled the bright tower.")
    for window, should_differ in (("1-1", False), (None, True)):
        strategy = create_strategy("htp", runtime, rewire=window)
        first_sentence = strategy.prepare([TEXT], "document", None)[0].pooled[:5]
        exit_layer = strategy.exit_layer
        states = [
            layer_inputs(runtime, strategy, text, range(exit_layer, exit_layer + 1)) for text in (TEXT, other)
        ]
        before = [s[exit_layer][first_sentence] for s in states]
        assert (not torch.allclose(before[0], before[1], atol=1e-6)) == should_differ, (arch, window)


@pytest.mark.parametrize("arch", DECODERS)
@pytest.mark.parametrize("name", ["htp", "tp"])
def test_batch_invariance_across_very_different_lengths(arch, name, runtimes, sample_corpus):
    long_text = " ".join((sample_corpus / "articles" / "composting.txt").read_text().split()[:400])
    texts = ["Short one.", long_text, "A middle sized text. It has two sentences."]
    strategy = create_strategy(name, runtimes[arch])
    together = strategy.encode(texts)
    alone = np.stack([strategy.encode([text])[0] for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_forward_stops_at_the_exit_layer(runtimes):
    runtime = runtimes["llama"]
    for exit_layer in (2, 4):
        strategy = create_strategy("htp", runtime, exit_layer=exit_layer)
        runtime.layers_run = runtime.layers_available = 0
        strategy.encode([TEXT, "Another text."])
        assert runtime.layers_run == exit_layer + 1


def test_defaults_follow_the_method(runtimes):
    strategy = create_strategy("htp", runtimes["qwen2"])
    assert strategy.rewire == (1, 2) and strategy.exit_layer == 4
    assert strategy.max_length == 4096  # min(8192, the tiny model's 4,096 positions)
    assert default_window(32) == ((1, 7), "HTP code default for 32-layer models")
    assert default_window(24)[0] == (1, 5) and default_window(28)[0] == (1, 6)
    assert strategy.query_template == "Retrieve relevant document. Text:{text}"
    assert strategy.document_template == "{text}"


def test_long_texts_lose_whole_trailing_sentences(runtimes):
    runtime = runtimes["llama"]
    tokenizer = runtime.tokenizer
    sizes = [len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in SENTENCES]
    spans = [spans_of(TEXT, SENTENCES)]
    # Room for BOS and the first two blocks (each with its two placeholders), not the third.
    max_length = 1 + sizes[0] + sizes[1] + 4 + 1
    strategy = create_strategy("htp", runtime, max_length=max_length)
    layout = strategy.prepare([TEXT], "document", spans)[0]
    whole = create_strategy("htp", runtime).prepare([TEXT], "document", spans)[0]
    assert len(layout.summaries) == len(layout.broadcasts) == 2 and strategy.truncated == 1
    cut = whole.summaries[2]  # everything before the third <PST>, minus its <B-PST>
    assert layout.ids == whole.ids[:1] + whole.ids[2:cut]
    # A single sentence longer than the limit is cut; its placeholders stay.
    tiny = create_strategy("htp", runtime, max_length=6)
    layout = tiny.prepare([TEXT], "document", spans)[0]
    assert len(layout.ids) == 6 and len(layout.summaries) == 1
    assert layout.ids[3:] == whole.ids[whole.summaries[0] + 1 :][:3]


def test_blocks_of_k_sentences(runtimes):
    runtime = runtimes["llama"]
    spans = [spans_of(TEXT, SENTENCES)]
    strategy = create_strategy("htp", runtime, block_sentences=2)
    layout = strategy.prepare([TEXT], "document", spans)[0]
    tokenizer = runtime.tokenizer
    first_block = tokenizer(" ".join(SENTENCES[:2]), add_special_tokens=False)["input_ids"]
    assert len(layout.summaries) == 2
    assert layout.ids[layout.summaries[0] + 1 : layout.summaries[1]] == first_block
    assert strategy.params["block_sentences"] == 2


def test_sentences_come_from_spacy_when_not_given(runtimes):
    strategy = create_strategy("htp", runtimes["llama"])
    given = strategy.prepare([TEXT], "document", [spans_of(TEXT, SENTENCES)])
    assert strategy.prepare([TEXT], "document", None) == given


def test_placeholder_rows_are_set_and_grown_only_when_needed(tmp_path, runtimes):
    runtime = runtimes["qwen3"]
    strategy = create_strategy("htp", runtime)
    weight = runtime.model.get_input_embeddings().weight
    np.testing.assert_allclose(weight[1000].numpy(), weight[:1000].mean(dim=0).numpy(), atol=1e-6)
    assert len(runtime.tokenizer) == 1000 and len(strategy.placeholders.tokenizer) == 1002
    randn = create_strategy("htp", runtime, placeholder_init="randn")
    first = weight[1000:1002].clone()
    create_strategy("tp", runtime, placeholder_init="randn")
    assert torch.equal(weight[1000:1002], first) and randn.params["placeholder_init"] == "randn"
    assert abs(float(first.std()) - 1.0) < 0.3
    # Qwen checkpoints carry spare rows: those are reused and the matrix keeps its size.
    folder = save_tiny_model("qwen2", tmp_path / "spare", train_tokenizer(), extra_rows=24)
    spare = load_runtime(str(folder), device="cpu", dtype="float32")
    notes = create_strategy("htp", spare).notes
    assert spare.model.get_input_embeddings().weight.shape[0] == 1024
    assert notes["embedding_rows"] == "spare rows reused (1024 rows)" and notes["placeholder_ids"] == [
        1000,
        1001,
    ]


def test_other_strategies_are_unaffected_by_placeholders(tiny_models):
    runtime = load_runtime(str(tiny_models["mistral"]), device="cpu", dtype="float32")
    before = create_strategy("mean", runtime).encode([TEXT, "<PST> literally"])
    create_strategy("htp", runtime).encode([TEXT])
    np.testing.assert_array_equal(create_strategy("mean", runtime).encode([TEXT, "<PST> literally"]), before)


def test_model_folder_is_unchanged_by_use(tiny_models, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_models["gemma2"], folder)

    def digest(root: Path) -> dict[str, str]:
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
        }

    before = digest(folder)
    runtime = load_runtime(str(folder), device="cpu", dtype="float32")
    create_strategy("htp", runtime).encode([TEXT])
    create_strategy("tp", runtime).encode([TEXT])
    assert digest(folder) == before


def test_bad_options_are_refused(runtimes):
    runtime = runtimes["llama"]
    for options, message in (
        ({"rewire": "3-1"}, "START <= STOP"),
        ({"rewire": "1-9"}, "STOP <= 6"),
        ({"rewire": "one"}, "START-STOP"),
        ({"exit_layer": 6}, "layers 0-5"),
        ({"placeholder_init": "zeros"}, "mean or randn"),
        ({"block_sentences": 0}, "at least 1"),
        ({"pool": "last"}, "--pool does not apply to strategy 'htp'"),
    ):
        with pytest.raises(RagidxError, match=message):
            create_strategy("htp", runtime, **options)
    with pytest.raises(RagidxError, match="empty text"):
        create_strategy("htp", runtime).encode(["   "])
    assert create_strategy("htp", runtime, exit_layer=-3).exit_layer == 3
