"""How many threads a forward pass runs on a CPU where the moment decides: the cores no other
process is using then. A one-text forward (a query) does everywhere; every slice of model work a
long-running ragidx runs for its clients (the scheduler's thread: queries, embeds, answers) does too.

A query's forward is short, and torch's OpenMP threads wait for each other at every operator: when
another process holds a core (a build, a second daemon), the thread on that core is descheduled and
the others wait for it, operator after operator. On two cores with both busy, SmolLM2's query took
1.9 s on two threads and 30 ms on one; with one busy, 40 ms (p95 142 ms) against 23 ms; quiet, two
threads were 1.3x faster than one (docs/precision.md, ``tests/benchmarks/query_threads.py``). Batches
fall off the same cliff: the daemon's embeds in slices beside two spinning processes did 14 texts/s
on two threads and 579 on one, and a search behind them waited up to 1.48 s instead of 0.51
(``tests/benchmarks/served_threads.py``). So such a forward takes as many threads as there are
cores that are idle now: Linux counts the
runnable threads of the whole machine in ``/proc/loadavg``, and this process's own in
``/proc/self/task``; a count above zero is taken again a moment later (see :func:`busy_elsewhere`).
``RAGIDX_QUERY_THREADS`` fixes the number instead. A build's batches keep torch's count: their
forwards are long, and beside two spinning processes they ran as fast on two threads as on one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ragidx.indexer.errors import RagidxError

THREADS_VARIABLE = "RAGIDX_QUERY_THREADS"
SETTLE_SECONDS = 0.0003  # long enough for a client that sent a query to wait for its answer


def busy_elsewhere() -> int | None:
    """Threads of other processes that hold or wait for a core now and a moment later, or None
    where this system does not say (not Linux).

    A process that has just sent this one its query (an HTTP client, ``ragidx query`` through the
    daemon), and this process's thread that handed the query over (asleep by the time its own
    threads are counted), run on for a fraction of a millisecond before they wait for the answer:
    counted once, they often took a core from the query. A
    process that computes is counted both times; one that went to wait meanwhile is not."""
    first = runnable_elsewhere()
    if not first:
        return first
    time.sleep(SETTLE_SECONDS)
    again = runnable_elsewhere()
    return None if again is None else min(first, again)


def runnable_elsewhere() -> int | None:
    """Threads of other processes running or waiting for a core now, or None where this system
    does not say (not Linux)."""
    try:
        runnable = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        own = 0
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                stat = (task / "stat").read_text()
                own += stat[stat.rindex(")") + 2] == "R"  # the state follows the command's name
    except (OSError, ValueError, IndexError):
        return None
    return max(0, runnable - max(own, 1))  # this thread is running, whatever its stat said


def idle_core_threads(most: int) -> int:
    """Threads for a forward now: ``$RAGIDX_QUERY_THREADS`` if set, else the cores (of ``most``)
    that no other process is using now, at least one."""
    given = os.environ.get(THREADS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise RagidxError(f"{THREADS_VARIABLE}={given!r} is not a number of threads (1 or more)")
        return int(given)
    busy = busy_elsewhere()
    return most if busy is None else max(1, min(most, (os.cpu_count() or most) - busy))


class _Shared:
    """torch keeps a thread count per thread (OpenMP's) and one for threads yet to start: each
    block sets and gives back its own thread's, and the count from before the first of several
    concurrent ones (HTTP requests) is the one each gives back. ``inside`` marks a thread already
    in a block: a query embedded within a served slice keeps the slice's count."""

    lock = threading.Lock()
    active = 0
    before = 0
    inside = threading.local()


@contextlib.contextmanager
def on_idle_cores() -> Iterator[None]:
    """Run the block (model work on a CPU, in this thread) on :func:`idle_core_threads` threads,
    then give torch back the count it had. Before torch is loaded there is nothing to fit (a
    keyword-only daemon never loads it)."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(_Shared.inside, "active", False):
        yield
        return
    with _Shared.lock:
        if _Shared.active == 0:
            _Shared.before = torch.get_num_threads()
        _Shared.active += 1
        before = _Shared.before
    _Shared.inside.active = True
    torch.set_num_threads(idle_core_threads(before))
    try:
        yield
    finally:
        _Shared.inside.active = False
        with _Shared.lock:
            _Shared.active -= 1
        torch.set_num_threads(before)
