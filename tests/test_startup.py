"""What a command pays before its first answer: imports it does not need, loads it could refuse
before, and the cheaper way to the same stop words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ragidx
from ragidx.app import Index, RagidxError

# What a query through the daemon must not load in its own process: the model stack, the vector
# index, the strategies and the model loader (each a part of the start-up the daemon is there to save).
NOT_FOR_A_QUERY = (
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "faiss",
    "sqlite_utils",
    "spacy",
    "ragidx.indexer.strategies",
    "ragidx.indexer.model.runtime",
    "ragidx.indexer.model.sources",
    "subprocess",  # only to start a daemon, which this one need not
)
# Prints, as a process ends, the modules it loaded.
REPORT = "import atexit, json, sys; atexit.register(lambda: print(json.dumps([*sys.modules])))"
# What the console script may load to hand a query to the command server, besides ragidx's own
# modules: what pip's script template imports (re, sys); a socket, JSON and a checksum; importlib
# for ragidx.app's lazy names (0.3 ms), and __future__ for annotations.
HAND_OVER = "import re, sys, json, socket, zlib, importlib, __future__"


def test_a_query_through_the_daemon_loads_nothing_it_does_not_use(daemon_env, small_index):
    """The client's imports are the daemon path's whole cost on its side (``python -X importtime``
    shows them): the CLI, the socket and the printing of hits, nothing heavier."""
    query = ["query", "refunds", "--index", str(small_index), "-k", "2"]
    run = [sys.executable, "-c", f"{REPORT}; from ragidx.cli import main; main()", *query]
    first = subprocess.run(run, env=daemon_env, capture_output=True, text=True, timeout=120)
    found = subprocess.run(run, env=daemon_env, capture_output=True, text=True, timeout=120)
    *expected, started_with = first.stdout.splitlines(keepends=True)
    *answer, modules = found.stdout.splitlines(keepends=True)
    assert answer == expected and expected
    assert "subprocess" in json.loads(started_with)  # it did start one: the second found it running
    loaded = set(json.loads(modules))
    assert loaded.isdisjoint(NOT_FOR_A_QUERY), sorted(loaded & set(NOT_FOR_A_QUERY))


def test_the_console_script_loads_only_what_handing_over_a_query_takes(tmp_path):
    """Without ``site`` (``python -S``), whose ``.pth`` files import typing and pathlib themselves
    in an editable install: the script's whole start-up beyond Python's own is then its imports."""
    (tmp_path / "ragidx").symlink_to(Path(ragidx.__file__).parent)  # ragidx on a path, no .pth
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "RAGIDX_NO_DAEMON": "0"}

    def loaded(code: str) -> set[str]:  # run in tmp_path, which `-c` puts first on the path
        run = [sys.executable, "-S", "-c", f"{REPORT}; {code}"]
        ran = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
        return set(json.loads(ran.stdout))

    needed = loaded(HAND_OVER)
    # no command server listens: the script tries the hand-over (the socket path, the request)
    # and would run the CLI itself, which it is not let do here
    script = loaded(
        "import re; from ragidx.__main__ import launcher; assert launcher.forwarded(['query', 'x']) is None"
    )
    own = {name for name in script if name.partition(".")[0] == "ragidx"}
    assert "ragidx.app.daemon.address" in own and not own & {"ragidx.cli", "ragidx.app.daemon.client"}
    assert script - own - needed == set()


def test_stop_words_come_without_importing_spacy():
    code = (
        "import sys\nfrom ragidx.indexer.ingest.languages import stop_words\nwords = stop_words()\n"
        "print(len(words), 'spacy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    from spacy.lang.en.stop_words import STOP_WORDS

    assert out.split() == [str(len(STOP_WORDS)), "False"]

    from ragidx.indexer.ingest.languages import stop_words

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
