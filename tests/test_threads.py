"""A one-text forward (a query) on a CPU, and every slice the scheduler runs, uses the cores no other
process is using: counted from /proc, fixed by RAGIDX_QUERY_THREADS, applied inside the forward or
slice, and given back afterwards."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model import threads
from ragidx.indexer.strategies import create_strategy

linux_only = pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="counts come from Linux's /proc")


@linux_only
def test_processes_that_hold_a_core_are_counted():
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        seen = []
        for _ in range(20):
            seen.append(threads.busy_elsewhere())
            time.sleep(0.02)
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    assert None not in seen and statistics.median(seen) >= 2  # others may be busy too (CI workers)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [([0], 0), ([None], None), ([1, 0], 0), ([2, 2], 2), ([3, 1], 1), ([1, None], None)],
)
def test_only_what_is_still_runnable_a_moment_later_is_busy(monkeypatch, samples, expected):
    """A client that has just sent its query runs on for a moment, then waits for the answer: a
    count above zero is taken again, and the smaller one stands (None: the system did not say)."""
    left, looks = iter(samples), []
    monkeypatch.setattr(threads, "runnable_elsewhere", lambda: looks.append(next(left)) or looks[-1])
    assert threads.busy_elsewhere() == expected and looks == samples


def test_the_threads_are_the_idle_cores_or_the_setting(monkeypatch):
    monkeypatch.delenv(threads.THREADS_VARIABLE, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cases = ((0, 8, 8), (3, 8, 5), (7, 8, 1), (12, 8, 1), (0, 4, 4), (6, 4, 2), (None, 4, 4))
    for busy, most, expected in cases:
        monkeypatch.setattr(threads, "busy_elsewhere", lambda busy=busy: busy)
        assert threads.idle_core_threads(most) == expected
    monkeypatch.setenv(threads.THREADS_VARIABLE, "3")
    assert threads.idle_core_threads(8) == 3
    for wrong in ("0", "two", "-1"):
        monkeypatch.setenv(threads.THREADS_VARIABLE, wrong)
        with pytest.raises(RagidxError, match=f"RAGIDX_QUERY_THREADS='{wrong}' is not a number of threads"):
            threads.idle_core_threads(8)


def test_a_query_runs_on_the_chosen_threads_and_gives_them_back(runtimes, monkeypatch):
    runtime = runtimes["llama"]
    strategy = create_strategy("mean", runtime)
    seen: list[int] = []
    hook = runtime.model.register_forward_hook(lambda *args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(threads.THREADS_VARIABLE, "1")
        alone = strategy.encode(["how long do refunds take"], "query")
        monkeypatch.setenv(threads.THREADS_VARIABLE, "3")
        wider = strategy.encode(["how long do refunds take"], "query")
        strategy.encode(["one document", "and another"], "document")  # a batch: left alone
    finally:
        hook.remove()
    assert seen == [1, 3, before] and torch.get_num_threads() == before
    np.testing.assert_allclose(alone, wider, atol=1e-6)


def test_concurrent_queries_give_back_the_count_from_before_the_first(monkeypatch):
    monkeypatch.setenv(threads.THREADS_VARIABLE, "1")
    before = torch.get_num_threads()
    inside = threading.Barrier(2)
    seen: list[tuple[int, int]] = []

    def query() -> None:
        with threads.on_idle_cores():
            inside.wait(timeout=10)  # both are inside at once
            during = torch.get_num_threads()
            inside.wait(timeout=10)
        seen.append((during, torch.get_num_threads()))

    workers = [threading.Thread(target=query) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    later: list[int] = []
    fresh = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert seen == [(1, before), (1, before)] and torch.get_num_threads() == before and later == [before]


def test_every_served_slice_runs_on_the_chosen_threads_and_a_query_inside_keeps_them(runtimes, monkeypatch):
    """The daemon's embeds fall off the same cliff as queries on a busy machine (14 texts/s on two
    threads beside two spinning processes, 579 on one): the scheduler runs each slice on the
    idle cores, and a one-text forward inside a slice keeps the slice's count, not torch's."""
    from ragidx.app.service.scheduler import Scheduler

    strategy = create_strategy("mean", runtimes["llama"])
    seen: list[int] = []
    hook = runtimes["llama"].model.register_forward_hook(lambda *args: seen.append(torch.get_num_threads()))
    monkeypatch.setenv(threads.THREADS_VARIABLE, "1")
    try:
        with Scheduler() as scheduler, scheduler.job("client", "embed") as job:
            before = scheduler.run(job, torch.get_num_threads)  # the slice's own count
            batch = scheduler.run(job, strategy.encode, ["one document", "and another"], "document")
            monkeypatch.setenv(threads.THREADS_VARIABLE, "3")

            def query_inside() -> int:
                os.environ[threads.THREADS_VARIABLE] = "2"  # read again, the query would take 2
                strategy.encode(["a query"], "query")
                return torch.get_num_threads()

            inside = scheduler.run(job, query_inside)
            after = scheduler.run(job, torch.get_num_threads)
    finally:
        hook.remove()
    assert (before, seen, inside, after) == (1, [1, 3], 3, 2)
    np.testing.assert_allclose(batch, strategy.encode(["one document", "and another"], "document"), atol=1e-6)
