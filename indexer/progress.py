"""Progress of a long step: a bar on a terminal, plain lines elsewhere (logs, CI, pipes).

tqdm draws a bar only on a terminal; redirected, it would print nothing (or carriage returns
that make one endless line), and a build of a large file ran for minutes without a word. Off a
terminal, a line is printed every :data:`LINE_SECONDS` seconds instead.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

LINE_SECONDS = float(os.environ.get("RAGIDX_PROGRESS_SECONDS", "30"))


class ProgressLines:
    """The part of tqdm's interface a build uses, printing ``desc: n/total unit, postfix, elapsed``."""

    def __init__(self, total: int, desc: str, unit: str, file: TextIO, interval: float = LINE_SECONDS):
        self.total, self.desc, self.unit, self.file, self.interval = total, desc, unit, file, interval
        self.n = 0
        self.printed: int | None = None  # the count the last line showed
        self.postfix: dict[str, Any] = {}
        self.started = self.last = time.perf_counter()

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.printed is not None and self.printed != self.n:  # lines were printed: say where it ended
            self._print()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._maybe_print()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values
        self._maybe_print()

    def _maybe_print(self) -> None:
        if time.perf_counter() - self.last >= self.interval:
            self._print()

    def _print(self) -> None:
        self.last, self.printed = time.perf_counter(), self.n
        details = "".join(f", {key.replace('_', '/')} {value}" for key, value in self.postfix.items())
        elapsed = self.last - self.started
        print(
            f"{self.desc}: {self.n}/{self.total} {self.unit}{details}, {elapsed:.0f} s",
            file=self.file,
            flush=True,
        )


def progress(total: int, desc: str, unit: str, enabled: bool = True) -> Any:
    """A tqdm bar on a terminal, :class:`ProgressLines` off one, nothing when not ``enabled``."""
    from tqdm import tqdm

    if enabled and not sys.stderr.isatty():
        return ProgressLines(total, desc, unit, sys.stderr)
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr)
