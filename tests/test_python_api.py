"""The library's door, ``ragidx.app``: build, update, remove, check, tune and embed without the CLI."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ragidx.app import Embedder, Index
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies import create_strategy


@pytest.fixture
def corpus(tmp_path, sample_corpus):
    folder = tmp_path / "corpus"
    shutil.copytree(sample_corpus / "faq", folder)
    return folder


def test_update_remove_and_check_through_the_index(corpus, tmp_path, tiny_models):
    index_dir = tmp_path / "index"
    model = str(tiny_models["llama"])
    first = Index.update(
        [corpus], index_dir, model=model, strategy="mean", device="cpu", progress=False, tune=False
    )
    files = sorted(str(path.resolve()) for path in corpus.iterdir())
    assert first.total_documents == len(files) and first.generation == 1
    with Index.open(index_dir, device="cpu") as index:
        report = index.remove([files[0]])
        assert report.removed == [files[0]] and report.generation == 2
        assert report.documents == len(files) - 1
        assert index.info()["generation"] == 2  # the open index follows the removal
        assert all(hit.path != files[0] for hit in index.search("question", k=50, mode="lexical"))
        with pytest.raises(RagidxError, match="no indexed document"):
            index.remove([files[0]])
    assert Index.check(index_dir).healthy
    (index_dir / "vectors-9.faiss").write_bytes(b"left over")
    found = Index.check(index_dir)
    assert [p.kind for p in found.problems] == ["stale-files"] and not found.healthy
    assert Index.check(index_dir, repair=True).healthy and not (index_dir / "vectors-9.faiss").exists()


def test_tune_through_the_index_stores_what_it_reports(corpus, tmp_path, tiny_models):
    index_dir = tmp_path / "index"
    Index.update(
        [corpus], index_dir, model=str(tiny_models["llama"]), device="cpu", progress=False, tune=False
    )
    with Index.open(index_dir, device="cpu") as index:
        report = index.tune(queries=30)
        assert index.meta["fusion"] == report.to_meta()  # the open index sees the stored weights
        assert report.reason  # the sample FAQ is below the size tuning needs: equal weights, and why


def test_the_embedder_embeds_as_the_strategy_does(tiny_models, runtimes):
    texts = ["How do I rebuild an index?", "Vectors live in FAISS."]
    embedder = Embedder(str(tiny_models["llama"]), "aligned-wva", device="cpu", dtype="float32", layers="1-2")
    direct = create_strategy("aligned-wva", runtimes["llama"], layers="1-2")
    for role in ("query", "document"):
        np.testing.assert_allclose(embedder.embed(texts, role), direct.encode(texts, role), atol=1e-5)
    with pytest.raises(RagidxError, match="does not apply to strategy 'mean'"):
        Embedder(str(tiny_models["llama"]), "mean", device="cpu", layers="1-2")
    with pytest.raises(RagidxError, match="unknown embedding option 'colour'"):
        Embedder(str(tiny_models["llama"]), device="cpu", colour="red")


def test_bad_strategy_options_are_refused_before_the_model_loads(corpus, tmp_path):
    """A named strategy's options are checked against its declaration first: the model path here
    does not exist, so reaching the model would fail with another error."""
    missing = str(tmp_path / "no-such-model")
    for options, message in [
        ({"strategy": "htp", "block_sentences": 0}, "--block-sentences must be at least 1, got 0"),
        ({"strategy": "mean", "layers": "1-2"}, "--layers does not apply to strategy 'mean'"),
    ]:
        with pytest.raises(RagidxError, match=message):
            Index.update([corpus], tmp_path / "index", model=missing, progress=False, **options)
