"""Intrinsic-dimension layer selection: TwoNN, the selection rule, the representations and the cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ragidx.app.research.calibrate import calibrate_and_cache, calibration_texts
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies import create_strategy
from ragidx.indexer.strategies.layer_calibration import (
    calibrate,
    layer_representations,
    load_calibration,
    select_layers,
    two_nn,
)


@pytest.mark.parametrize("dimension", [2, 5, 10])
def test_two_nn_recovers_the_dimension_of_a_linear_subspace(dimension):
    rng = np.random.default_rng(dimension)
    basis, _ = np.linalg.qr(rng.standard_normal((64, dimension)))
    points = rng.standard_normal((1000, dimension)) @ basis.T + 3.0
    assert two_nn(points) == pytest.approx(dimension, rel=0.2)


def test_two_nn_ignores_duplicates_and_needs_points():
    rng = np.random.default_rng(0)
    points = rng.standard_normal((300, 3))
    assert two_nn(np.vstack([points, points[:50]])) == two_nn(points)
    with pytest.raises(RagidxError, match="at least 3"):
        two_nn(np.ones((10, 4)))


def test_two_nn_is_the_facco_fit_through_the_origin():
    """Hand computation on a small cloud: slope of -log(1-i/N) against log μ over the kept 90%."""
    rng = np.random.default_rng(1)
    points = rng.standard_normal((40, 4))
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1) + np.diag(np.full(40, np.inf))
    ordered = np.sort(distances, axis=1)
    mu = np.sort(ordered[:, 1] / ordered[:, 0])
    x = np.log(mu[:36])
    y = -np.log(1 - np.arange(1, 37) / 40)
    assert two_nn(points) == pytest.approx((x @ y) / (x @ x), rel=1e-9)


@pytest.mark.parametrize(
    ("curve", "expected"),
    [
        ([9, 8, 7, 6, 3, 5, 6, 7, 8, 9], (4, [4, 5])),  # L=10: window floor(0.1·10) = 1 past l*
        ([9, 1, 7, 6, 5, 4, 2, 7, 8, 9], (6, [6, 7])),  # global minimum at 1 is in the first 20%
        ([9, 8, 7, 6, 5, 4, 3, 2, 1.5, 1], (9, [9])),  # the window stops at the last layer
        ([1, 5, 4, 4, 6], (2, [2])),  # ties take the first; L=5 excludes layer 0, window 0
        ([*[9.0] * 12, 2.0, *[9.0] * 23], (12, [12, 13, 14, 15])),  # Qwen3-4B's depth: window 3
        ([9, float("nan"), 3, float("nan"), 5], (2, [2])),  # layers without an estimate are skipped
    ],
)
def test_selection_rule(curve, expected):
    assert select_layers(curve) == expected


def test_representations_are_each_layers_mean_without_special_tokens(runtimes, plain_models):
    texts = ["Tides rise twice a day.", "The lamp is lit at dusk and put out at dawn by the keeper."]
    representations = layer_representations(runtimes["llama"], texts)
    model, tokenizer = plain_models["llama"]
    for index, text in enumerate(texts):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        assert ids[0, 0] == tokenizer.bos_token_id
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        for layer in range(5):  # hidden_states[layer + 1] is layer's output (the last one is post-norm)
            expected = hidden[layer + 1][0, 1:].mean(dim=0).numpy()
            np.testing.assert_allclose(representations[layer, index], expected, atol=1e-5)


def test_texts_from_lines_jsonl_and_documents(tmp_path, runtimes, sample_corpus):
    tokenizer = runtimes["qwen2"].tokenizer
    lines = tmp_path / "texts.txt"
    lines.write_text("first text\n\nsecond text\nfirst text\n", encoding="utf-8")
    assert calibration_texts(lines, 10, tokenizer) == (["first text", "second text"], str(lines))
    records = tmp_path / "corpus.jsonl"
    records.write_text('{"_id": "1", "text": "an abstract"}\n{"text": "a claim"}\n', encoding="utf-8")
    assert calibration_texts(records, 10, tokenizer)[0] == ["an abstract", "a claim"]
    records.write_text('{"title": "no text"}\n', encoding="utf-8")
    with pytest.raises(RagidxError, match=r"corpus.jsonl:1: .*\"text\""):
        calibration_texts(records, 10, tokenizer)
    sentences, source = calibration_texts(None, 10_000, tokenizer)
    assert source == str(sample_corpus) and len(sentences) > 200
    assert all(len(s.split()) >= 4 for s in sentences) and len(set(sentences)) == len(sentences)
    subsample = calibration_texts(None, 50, tokenizer)[0]
    assert len(subsample) == 50 and subsample == calibration_texts(None, 50, tokenizer)[0]
    assert set(subsample) <= set(sentences)
    with pytest.raises(RagidxError, match="not found"):
        calibration_texts(tmp_path / "missing", 10, tokenizer)


def test_too_few_texts_are_refused(runtimes):
    with pytest.raises(RagidxError, match="at least 20 distinct texts"):
        calibrate(runtimes["qwen2"], ["one text", "two texts"], "a list")


def test_cache_round_trip_feeds_kv_embedding(runtimes, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path))
    runtime = runtimes["gemma2"]
    assert load_calibration(runtime) is None
    calibration, path = calibrate_and_cache(runtime, None, 120, progress=False)
    assert path.parent == tmp_path / "calibration" and "_gemma2-" in path.name
    assert select_layers(calibration.curve) == (calibration.minimum_layer, calibration.layers)
    assert load_calibration(runtime) == calibration
    strategy = create_strategy("kv-embedding", runtime)
    assert strategy.layers == calibration.layers
    assert strategy.layer_source == calibration.describe()
    assert create_strategy("kv-embedding", runtimes["qwen2"]).layer_source.startswith("fallback")
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "layers": [99]}))
    assert load_calibration(runtime) is None  # layers this model lacks: ignored, not trusted
    path.write_text("{not json")
    assert load_calibration(runtime) is None
