"""``ragidx watch``: keep an index current while its folders change (watchfiles, the ``watch`` extra).

Each burst of changes becomes one ordinary incremental build (the same lock, the same atomic
commit), so readers and servers see each new generation as it lands. A file is built only once
it has stopped changing for ``settle`` seconds, so one being written is not indexed half-done;
a changed file the build still had to skip (a PDF saved in parts) is tried again a few times.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragidx.indexer.build.pipeline import BuildReport, build
from ragidx.indexer.build.settings import BuildOptions
from ragidx.indexer.errors import IndexLocked, RagidxError
from ragidx.indexer.ingest.sources import READERS, normal_path

WATCH_HINT = "ragidx watch needs the watch extra: pip install 'ragidx[watch]'"
TICK_MS = 200  # how often the loop looks at unsettled files when nothing happens
RETRIES = 3  # builds that may skip a changed file before it is left as skipped
LOCKED_RETRY_SECONDS = 2.0


@dataclass
class Pending:
    """Changed files waiting to be built: each file's last seen (size, mtime) and since when."""

    seen: dict[str, tuple[tuple[int, int] | None, float]] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    locked_until: float | None = None  # another build held the lock: build again from this time

    def due(self, now: float, settle: float) -> bool:
        """Whether to build now: settled changes, or a build the lock put off whose time came."""
        if self.locked_until is not None:
            return now >= self.locked_until
        return bool(self.seen) and self.settled(now, settle)

    def add(self, path: str, now: float) -> None:
        self.seen[path] = (_signature(path), now)

    def settled(self, now: float, settle: float) -> bool:
        """Whether every pending file kept its size and mtime for ``settle`` seconds (a deleted
        file is settled at once)."""
        for path, (signature, since) in list(self.seen.items()):
            current = _signature(path)
            if current != signature:
                self.seen[path] = (current, now)
                return False
            if current is not None and now - since < settle:
                return False
        return True

    def after_build(self, report: BuildReport, now: float) -> None:
        """Forget what was built; keep changed files the build skipped, a few more times."""
        skipped = {item.path for item in report.skipped}
        again = [p for p in self.seen if p in skipped and self.retries.get(p, 0) < RETRIES]
        self.seen.clear()
        self.locked_until = None
        for path in again:
            self.retries[path] = self.retries.get(path, 0) + 1
            self.add(path, now)


def _signature(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def watch(
    paths: Sequence[str | Path],
    options: BuildOptions,
    on_build: Callable[[BuildReport], None],
    on_error: Callable[[str], None],
    settle: float = 1.0,
    stop: threading.Event | None = None,
    on_start: Callable[[], None] = lambda: None,
) -> None:
    """Build once, then again after every settled burst of changes under ``paths``, until
    ``stop`` is set or Ctrl-C (KeyboardInterrupt, raised to the caller); ``on_start`` is called
    once the folders are watched. A build that fails
    (no readable documents, a full disk) is reported through ``on_error`` and the watch goes on;
    one that finds the index locked by another build is made again once that one may be done."""
    loaded: dict[tuple[Any, ...], Any] = {}  # the model, loaded once
    pending = Pending()

    def run() -> None:
        try:
            report = build(paths, options, loaded)
        except IndexLocked as error:  # another build is writing: try again once it may be done
            if pending.locked_until is None:
                on_error(f"{error}; waiting for it")
            pending.locked_until = time.monotonic() + LOCKED_RETRY_SECONDS
            return
        except RagidxError as error:
            on_error(str(error))
            pending.seen.clear()
            pending.locked_until = None
            return
        pending.after_build(report, time.monotonic())
        on_build(report)

    stream = _changes(paths, options.index_dir, stop)
    next(stream)  # watching from here on, so nothing that changes during the first build is missed
    on_start()
    run()
    for changes in stream:
        now = time.monotonic()
        for path in changes:
            pending.add(path, now)
        if pending.due(now, settle):
            run()


def _changes(
    paths: Sequence[str | Path], index_dir: Path, stop: threading.Event | None
) -> Iterator[set[str]]:
    """Sets of changed document paths, and an empty set every tick so settling can be checked."""
    try:
        import watchfiles
    except ImportError:
        raise RagidxError(WATCH_HINT) from None
    for path in paths:
        if not Path(path).exists():
            raise RagidxError(f"path not found: {path}")
    relevant = DocumentFilter([normal_path(path) for path in paths], normal_path(index_dir))
    for changes in watchfiles.watch(
        *paths, watch_filter=relevant, yield_on_timeout=True, rust_timeout=TICK_MS, stop_event=stop
    ):
        yield {normal_path(path) for _, path in changes}


class DocumentFilter:
    """Changes a build would see: supported files, nothing hidden below a watched root (as the
    scan skips them), nothing in the index folder. A folder without a suffix is let through
    (deleting one removes its documents)."""

    def __init__(self, roots: Sequence[str], index_dir: str):
        self.roots = [Path(root) for root in roots]
        self.index_dir = Path(index_dir)

    def __call__(self, change: Any, path: str) -> bool:
        changed = Path(normal_path(path))
        if changed == self.index_dir or self.index_dir in changed.parents:
            return False
        below = [changed.relative_to(root).parts for root in self.roots if changed.is_relative_to(root)]
        if any(part.startswith(".") for parts in below for part in parts):
            return False
        suffix = changed.suffix.lower()
        return suffix in READERS or (not suffix and not changed.is_file())
