"""`ragidx watch`: a real watcher in a subprocess builds on each settled burst of changes, never
indexes a file while it is being written, and stops cleanly on SIGINT and SIGTERM; plus the
filter and the settling rule on their own."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ragidx.app import Index
from ragidx.indexer.build.watch import DocumentFilter, Pending
from ragidx.indexer.ingest.sources import normal_path
from ragidx.indexer.storage.writer import IndexWriter
from tests.support.child_setup import interruptible, prepared
from tests.support.cli import RAGIDX, child_env

pytest.importorskip("watchfiles")


class Watcher:
    """``ragidx watch --json`` running; its stdout lines (one JSON summary per build) in a queue."""

    def __init__(self, *args: str | Path):
        self.process = subprocess.Popen(
            prepared(interruptible, [RAGIDX, "watch", *args, "--json"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**child_env(), "PYTHONFAULTHANDLER": "1"},  # SIGABRT dumps every thread's stack
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def next_build(self, timeout: float = 60.0) -> dict:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            self.process.kill()
            raise AssertionError(f"no build within {timeout} s: {self.process.stderr.read()}") from None

    def no_build_for(self, seconds: float) -> bool:
        try:
            self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def stop(self, sig: int) -> tuple[int, str]:
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # hung: show where, from faulthandler's dump
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(timeout=30)
            raise AssertionError(f"still running 60 s after {sig!r}: {self.process.stderr.read()}") from None
        return code, self.process.stderr.read()


def changes(report: dict) -> tuple[int, int, int, int]:
    return report["new"], report["updated"], report["unchanged"], report["removed"]


def indexed_text(index: Path, path: Path) -> str:
    """The chunk text stored for one document (the Python API in this process, lexical search)."""
    with Index.open(index) as opened:
        hits = opened.search("tidal barrages lagoons turbines", k=10, mode="lexical")
    return " ".join(hit.text for hit in hits if hit.path == str(path))


def small_corpus(sample_corpus: Path, folder: Path) -> Path:
    folder.mkdir()
    for path in sorted(sample_corpus.rglob("*.md"))[:3]:
        (folder / path.name).write_text(path.read_text())
    return folder


def test_changes_are_built_once_settled_and_the_watch_stops_cleanly(tiny_models, sample_corpus, tmp_path):
    corpus = small_corpus(sample_corpus, tmp_path / "corpus")
    index = corpus / ".ragidx"  # inside the watched folder: its own writes must not trigger builds
    with Watcher(corpus, "--index", index, "--model", tiny_models["qwen2"], "--settle", "1.0") as watcher:
        watch_and_stop(watcher, corpus, index)
    with Index.open(index) as opened:
        assert (opened.meta["generation"], opened.reader.counts()["documents"]) == (4, 4)


def test_sigterm_stops_the_watch_cleanly(tiny_models, sample_corpus, tmp_path):
    corpus = small_corpus(sample_corpus, tmp_path / "corpus")
    index = tmp_path / "index"
    with Watcher(corpus, "--index", index, "--model", tiny_models["qwen2"]) as watcher:
        assert changes(watcher.next_build()) == (3, 0, 0, 0)
        code, stderr = watcher.stop(signal.SIGTERM)
    assert code == 0 and stderr.strip().endswith("stopped watching"), stderr
    with Index.open(index) as opened:
        assert opened.reader.counts()["documents"] == 3


def watch_and_stop(watcher: Watcher, corpus: Path, index: Path) -> None:
    assert changes(watcher.next_build()) == (3, 0, 0, 0)
    assert watcher.no_build_for(1.5)  # the index's own files changed; nothing to build

    new = corpus / "tides.md"
    with new.open("w") as file:  # written in two parts, 0.5 s apart: settle must wait for both
        file.write("Tidal barrages hold water behind a dam.\n\n")
        file.flush()
        time.sleep(0.5)
        file.write("Lagoons release it through turbines at slack water.\n")
    (corpus / "notes.tmp").write_text("an unsupported file: no build")
    report = watcher.next_build()
    assert changes(report) == (1, 0, 3, 0) and report["generation"] == 2
    assert watcher.no_build_for(1.2)  # one build for the whole burst
    stored = indexed_text(index, new)
    assert "Tidal barrages hold water" in stored and "Lagoons release it through turbines" in stored

    with IndexWriter(index):  # another build holds the lock: the change waits for it
        (corpus / "locked.md").write_text("Written while another build held the lock.\n")
        assert watcher.no_build_for(2.5)
    assert changes(watcher.next_build())[:3] == (1, 0, 4)

    (corpus / next(iter(sorted(p.name for p in corpus.glob("*.md"))))).unlink()
    assert changes(watcher.next_build())[3] == 1

    code, stderr = watcher.stop(signal.SIGINT)
    assert code == 0 and stderr.strip().endswith("stopped watching"), stderr
    assert stderr.count("is locked: another build is writing to it; waiting for it") == 1


def test_the_filter_passes_only_what_a_build_would_read(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "file.md").write_text("x")
    relevant = DocumentFilter([normal_path(root)], normal_path(root / ".ragidx"))
    assert relevant(None, str(root / "sub" / "a.pdf")) and relevant(None, str(root / "b.DOCX"))
    assert relevant(None, str(root / "gone-folder"))  # deleted: its documents go
    assert not relevant(None, str(root / "file.md~")) and not relevant(None, str(root / "c.png"))
    assert not relevant(None, str(root / ".hidden" / "a.md")) and not relevant(None, str(root / ".a.md.swp"))
    assert not relevant(None, str(root / ".ragidx" / "ragidx.db"))


def test_a_file_settles_only_once_it_stops_changing(tmp_path):
    path = tmp_path / "a.md"
    path.write_text("first")
    pending = Pending()
    pending.add(str(path), now=100.0)
    assert not pending.settled(now=100.5, settle=1.0)
    path.write_text("first and more")  # changed again: the clock restarts
    assert not pending.settled(now=101.2, settle=1.0)
    assert not pending.settled(now=102.0, settle=1.0)
    assert pending.settled(now=102.3, settle=1.0)
    path.unlink()
    pending.add(str(path), now=103.0)
    assert pending.settled(now=103.0, settle=1.0)  # deleted: nothing to wait for
