from __future__ import annotations

import collections
import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from tests.support.cli import RAGIDX, child_env
from tests.support.lifecycle import build
from tests.support.tiny_models import DECODERS, ENCODER, SAMPLE_CORPUS, save_tiny_model, train_tokenizer

# The files that take longest (worker seconds on two cores: real weights ~800, the CLI, GGUF
# conversion and the index's life ~200 each, a long-document build ~160, Ray ~110) go first: the
# workers take a file at a time in collection order, so one of them started last would run on
# alone (on its share of the cores) after the other had finished.
LONGEST_FIRST = (
    "test_real_models.py",
    "test_gguf.py",
    "test_cli.py",
    "test_lifecycle.py",
    "test_long_documents.py",
    "test_distributed.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: number for number, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def worker_threads() -> int | None:
    """Each xdist worker's share of torch's threads, or None outside xdist. Two workers on two cores
    each running torch on both cores wait for each other at every operator: SmolLM2 embedding the
    sample corpus (mean pooling) in two processes at once took 50 s each on two threads, 37 s on
    one (17 s alone on two; AMD EPYC, AVX2, 2 cores)."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return max(1, torch.get_num_threads() // workers) if workers > 1 else None


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Calibrations go to a temporary cache, never the user's, and start empty in every run (but a
    GGUF model is converted once for all workers: ragidx's lock makes the second wait for it); no
    command starts a daemon (tests/test_daemon.py starts its own, in a private folder); a query
    runs on torch's own thread count, not the cores idle at that moment (tests/test_threads.py
    tests that), so its vector is the same bit for bit however busy the machine is; each worker,
    and every command it starts, runs torch on its share of the cores (:func:`worker_threads`)."""
    import torch

    threads = worker_threads()
    if threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the ragidx commands a test starts
    folder = tmp_path_factory.mktemp("cache")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers share this run's folder above their own
        converted = tmp_path_factory.getbasetemp().parent / "converted-models"
        converted.mkdir(exist_ok=True)
        (folder / "models").symlink_to(converted)
    os.environ["RAGIDX_CACHE_DIR"] = str(folder)
    os.environ["RAGIDX_NO_DAEMON"] = "1"  # commands answer in their own process unless a test says
    os.environ["RAGIDX_QUERY_THREADS"] = str(torch.get_num_threads())
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folder of each small random model, keyed by architecture (llama ... gemma2, bert)."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = train_tokenizer()
    return {arch: save_tiny_model(arch, root / arch, tokenizer) for arch in (*DECODERS, ENCODER)}


@pytest.fixture(scope="session")
def runtimes(tiny_models: dict[str, Path]):
    """Each tiny model loaded once through ragidx's loader, in float32 on the CPU."""
    from ragidx.indexer.model.runtime import load_runtime

    return {
        arch: load_runtime(str(path), device="cpu", dtype="float32") for arch, path in tiny_models.items()
    }


@pytest.fixture(scope="session")
def sample_corpus() -> Path:
    return SAMPLE_CORPUS


@pytest.fixture(scope="session")
def plain_models(tiny_models):
    """The same folders loaded with plain transformers, independent of ragidx's runtime."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    loaded = {}
    for arch, path in tiny_models.items():
        model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        loaded[arch] = (model, AutoTokenizer.from_pretrained(path))
    return loaded


@pytest.fixture
def index_threads(monkeypatch):
    """``watch(*names)`` records, from then on, which threads call each of :class:`Index`'s
    methods named, in the dictionary it returns (method -> thread idents)."""
    from ragidx.app import Index

    used: dict[str, set[int]] = collections.defaultdict(set)

    def watch(*names: str) -> dict[str, set[int]]:
        for name in names:
            original = getattr(Index, name)

            def recorded(self, *args, _name=name, _original=original, **kwargs):
                used[_name].add(threading.get_ident())
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(Index, name, recorded)
        return used

    return watch


@pytest.fixture
def daemon_env() -> dict[str, str]:
    """An environment whose daemon lives in a private folder of this test (short: a socket's path
    has at most 107 bytes) and is stopped after it."""
    runtime = Path(tempfile.mkdtemp(prefix="rgx-", dir="/tmp"))
    env = {**child_env(), "XDG_RUNTIME_DIR": str(runtime), "RAGIDX_NO_DAEMON": "0"}
    yield env
    subprocess.run([RAGIDX, "daemon", "stop"], env=env, capture_output=True, timeout=60)
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def small_index(tmp_path, tiny_models, sample_corpus) -> Path:
    """Two folders of the sample corpus, kv-embedding on the tiny Qwen 2 model, untuned."""
    from ragidx.app import Index

    index = tmp_path / "index"
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False, "tune": False}
    Index.update([sample_corpus / "notes", sample_corpus / "faq"], index, strategy="kv-embedding", **options)
    return index


@pytest.fixture
def corpus(tmp_path, sample_corpus) -> Path:
    shutil.copytree(sample_corpus, tmp_path / "corpus")
    return tmp_path / "corpus"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_models, sample_corpus):
    """The sample corpus (a copy) and its index; tests copy both before changing them."""
    root = tmp_path_factory.mktemp("lifecycle")
    shutil.copytree(sample_corpus, root / "corpus")
    build(root / "corpus", root / "index", tiny_models["qwen2"])
    return root


@pytest.fixture
def workspace(built, tmp_path) -> tuple[Path, Path]:
    """A private copy of the built corpus and index, at the same relative place."""
    shutil.copytree(built / "corpus", tmp_path / "corpus")
    shutil.copytree(built / "index", tmp_path / "index")
    with sqlite3.connect(tmp_path / "index" / "ragidx.db") as db:
        db.execute("update documents set path = replace(path, ?, ?)", [str(built), str(tmp_path)])
    return tmp_path / "corpus", tmp_path / "index"
