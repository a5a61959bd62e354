"""Progress of a long step: a bar on a terminal, plain lines elsewhere (logs, CI, pipes).

tqdm draws a bar only on a terminal; redirected, it would print nothing (or carriage returns
that make one endless line), and a build of a large file ran for minutes without a word. Off a
terminal, a line is printed every :data:`LINE_SECONDS` seconds instead.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

LINE_SECONDS = float(os.environ.get("RAGIDX_PROGRESS_SECONDS", "30"))
QUIET_SECONDS = 5.0  # at intervals below this, a line is printed only when the counts moved


class ProgressLines:
    """The part of tqdm's interface a build uses, printing ``desc: n/total unit (share), postfix,
    elapsed, ETA`` (with ``scale``, n and total are bytes, shown as ``12 kB of 40 kB``): a line
    every ``interval`` seconds while it runs, even through a forward pass that takes longer (a
    timer thread prints them), and, if any was printed, a last one with the final counts (a step
    shorter than ``interval`` prints nothing)."""

    def __init__(
        self,
        total: float,
        desc: str,
        unit: str,
        file: TextIO,
        interval: float = LINE_SECONDS,
        scale: bool = False,
    ):
        self.total, self.desc, self.unit, self.file, self.interval = total, desc, unit, file, interval
        self.scale = scale
        self.n = 0.0
        self.postfix: dict[str, Any] = {}
        self.printed: str | None = None  # the counts the last line showed
        self.started = self.last = time.perf_counter()
        self.lock = threading.Lock()  # the counts, updated by the build's thread
        self.printing = threading.Lock()  # deciding on and printing a line: the build's thread or the timer
        self.done = threading.Event()
        self.timer = threading.Thread(target=self._tick, name="ragidx-progress", daemon=True)

    def __enter__(self) -> ProgressLines:
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.timer.join()
        if self.printed is not None and self.printed != self._counts():  # the last line: final counts
            self._print()

    def update(self, n: float = 1) -> None:
        with self.lock:
            self.n += n
        self._maybe_print()

    def set_postfix(self, **values: Any) -> None:
        with self.lock:
            self.postfix = values
        self._maybe_print()

    def _maybe_print(self, idle: bool = False) -> None:
        """A line once ``interval`` has passed, if the counts moved (or, from the timer, at long
        intervals even if not: a forward pass may take minutes). Decided and printed under one
        lock, so the build's thread and the timer never print the same moment twice."""
        with self.printing:
            if time.perf_counter() - self.last < self.interval:
                return
            if self.printed != self._counts() or (idle and self.interval >= QUIET_SECONDS):
                self._print()  # (the first line comes after one interval, counts moved or not)

    def _tick(self) -> None:
        while not self.done.wait(min(self.interval, 1.0) if self.interval > 0 else 0.05):
            self._maybe_print(idle=True)

    def _counts(self) -> str:
        with self.lock:
            details = "".join(f", {key.replace('_', '/')} {value}" for key, value in self.postfix.items())
            if self.scale:
                done = f"{_size(self.n)} of {_size(self.total)}"
            else:
                done = f"{self.n:.0f}/{self.total:.0f} {self.unit}"
            share = f" ({self.n / self.total:.0%})" if self.total else ""
            return f"{done}{share}{details}"

    def _print(self) -> None:
        """One line (under ``printing``, or once the timer has stopped)."""
        counts = self._counts()
        self.last, self.printed = time.perf_counter(), counts
        elapsed = self.last - self.started
        with self.lock:
            n = self.n
        left = f", ETA {_duration(elapsed * (self.total - n) / n)}" if 0 < n < self.total else ""
        print(f"{self.desc}: {counts}, {elapsed:.0f} s{left}", file=self.file, flush=True)


def _size(count: float) -> str:
    return f"{count / 2**20:.1f} MB" if count >= 2**20 else f"{count / 1024:.0f} kB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def progress(total: float, desc: str, unit: str, enabled: bool = True, scale: bool = False) -> Any:
    """A tqdm bar on a terminal, :class:`ProgressLines` off one, nothing when not ``enabled``;
    ``scale``: ``total`` counts bytes, shown as kB/MB."""
    from tqdm import tqdm

    if enabled and not sys.stderr.isatty():
        return ProgressLines(total, desc, unit, sys.stderr, scale=scale)
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=scale,
        unit_divisor=1024 if scale else 1000,
        disable=not enabled,
        file=sys.stderr,
    )


def notice(message: str, enabled: bool = True) -> None:
    """One line on stderr about a long step that has no bar (a model being loaded)."""
    if enabled:
        print(message, file=sys.stderr, flush=True)
