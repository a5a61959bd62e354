"""What a command pays before its first answer: imports it does not need, loads it could refuse
before, and the cheaper way to the same stop words."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ragidx.app import Index, RagidxError

LIGHT_CODE = (
    "import sys\nfrom ragidx import cli\n"
    "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'transformers', 'faiss', "
    "'spacy', 'sqlite_utils', 'tokenizers'}))"
)


def test_the_cli_starts_without_numpy_or_the_model_stack():
    """`ragidx query` through the daemon imports the CLI and nothing heavier: its start-up is the
    daemon path's whole cost on the client side."""
    out = subprocess.run([sys.executable, "-c", LIGHT_CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_stop_words_come_without_importing_spacy():
    code = (
        "import sys\nfrom ragidx.indexer.storage.lexical import stop_words\nwords = stop_words()\n"
        "print(len(words), 'spacy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    from spacy.lang.en.stop_words import STOP_WORDS

    assert out.split() == [str(len(STOP_WORDS)), "False"]

    from ragidx.indexer.storage.lexical import stop_words

    assert stop_words() == frozenset(STOP_WORDS)


def test_a_conflicting_build_is_refused_before_anything_loads(
    tmp_path, tiny_models, sample_corpus, monkeypatch
):
    from ragidx.indexer.build import pipeline

    index = tmp_path / "index"
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False, "tune": False}
    Index.update([sample_corpus / "faq"], index, **options)

    def never(*args, **kwargs):
        raise AssertionError("loaded a model for a build it had to refuse")

    monkeypatch.setattr(pipeline, "load_runtime", never)
    monkeypatch.setattr(pipeline, "resolve_model", never)
    for conflict, shown in (
        ({"strategy": "htp"}, "strategy 'aligned-wva' -> 'htp'"),
        ({"model": str(tiny_models["llama"])}, "model"),
        ({"chunk_tokens": 64}, "chunk_tokens 256 -> 64"),
    ):
        started = time.perf_counter()
        with pytest.raises(RagidxError, match=rf"other settings \(.*{shown}.*\); pass --rebuild"):
            Index.update([sample_corpus / "faq"], index, **{**options, **conflict})
        assert time.perf_counter() - started < 2
