"""Where ragidx keeps what it computes once per model (calibrations, converted GGUF models), and
the small JSON files of facts it measured once (precision verdicts, GGUF hashes and headers)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir


def cache_dir() -> Path:
    """``$RAGIDX_CACHE_DIR`` or the platform's user cache directory for ragidx."""
    return Path(os.environ.get("RAGIDX_CACHE_DIR") or user_cache_dir("ragidx"))


def read_json_cache(path: Path) -> dict[str, Any]:
    """A JSON object cached at ``path``; empty when missing, unreadable or damaged (it is remade)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_cache(path: Path, data: dict[str, Any]) -> None:
    """Replace the cache file whole (a reader never sees half of it); a read-only cache is no error
    (it only costs the time to find the facts again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(data, indent=1), encoding="utf-8")
        partial.replace(path)
    except OSError:
        pass


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` while a fact for the cache at ``path`` is found: processes that would
    measure it at once take turns, and the later ones read the first's (a timing taken while
    another process times the same thing is wrong for both). Where the cache cannot be written,
    no lock: measuring twice is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(f"{path.name}.lock"), "w")  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
