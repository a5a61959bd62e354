"""One scheduler for model work, shared by every client of a long-running ragidx: the daemon,
``ragidx serve``, ``ragidx mcp`` and the LangChain and LlamaIndex adapters.

Model work runs on one thread (:data:`THREAD_NAME`). torch's OpenMP keeps a pool of workers for
each thread that runs an operator; once a process has more of them than cores they stop spinning
between operators and sleep, and every operator pays to wake them (Gemma 3's hybrid search on 2
cores of an AMD EPYC held to AVX2: 43-44 ms on each request's thread, 35-37 ms on one model thread,
``tests/benchmarks/thread_pools.py``). One thread also keeps two forwards from interleaving: a
strategy re-routes the model's attention for the length of one.

Before this module that thread ran each request whole, in arrival order, behind one lock: an
embed of 3,000 texts held every query for 100 s, a streamed answer held the model while it waited
on a chat endpoint, and a lexical search that needs no model waited for it all the same. Now:

- Work is cut into *slices* (a batch of texts, one token of an answer: :data:`SLICE_SECONDS` or
  less) that callers hand in one at a time from their own threads (:meth:`Scheduler.run`), and the
  model thread takes next the slice of the job that has had the least model time (the policy
  called least attained service), clients in turn among equals: a query waits at most one slice
  however many long jobs run (taken in turn, two embeds made a query wait two slices, and under
  load its p99 was 3.4 s), and long jobs share the model. Work that needs no model (keyword
  search, a hybrid search that weighs the vectors 0, status, a chat endpoint's answer) never
  comes here.
- Slices given one batch key (the query embeddings of one index's searches) that wait together
  run as one call (:meth:`Scheduler.run_batched`): one forward pass for every query waiting.
- A job whose client went away (its ``cancel`` event set) loses its waiting slices at once, and
  its caller is told (:class:`Cancelled`) at the next slice.
- At most ``max_jobs`` jobs use the model at once (a job counts from its first slice, so work
  that needs no model is never refused); the next is refused with :class:`Busy`, which says when
  to try again (HTTP 503 with ``Retry-After``).
- *Background* jobs (the daemon's warm-up) run only when no other slice waits.
- Each slice runs on the cores no other process is using then
  (:func:`~ragidx.indexer.model.threads.on_idle_cores`): beside two spinning processes on two
  cores, embeds ran 14 texts/s on two threads and 579 on one, and a search waiting behind their
  slices up to 1.48 s instead of 0.51 (``tests/benchmarks/served_threads.py``).
- :meth:`Scheduler.status` lists every job, running or waiting, with its client.

The scheduling is Ollama's and TEI's in small (a bounded queue, batches of what waits), with
llama.cpp's server's turn per token, the least served job first.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ragidx.indexer.errors import Cancelled, RagidxError
from ragidx.indexer.model.threads import on_idle_cores

THREAD_NAME = "ragidx-model"
SLICE_SECONDS = 0.4  # what a slice of a long job aims at, so a query waits about this much behind it
MAX_JOBS = 32  # jobs waiting or running at once; the next is refused with Busy
MAX_BATCH = 64  # queries embedded in one forward: past this, padding and memory grow faster than the gain
CANCEL_POLL_SECONDS = 0.2  # how often a caller waiting for its slice looks at its job's cancel event
CLOSE_SECONDS = 10.0  # how long close() waits for the slice running to end (a few slices at most)


class Busy(RagidxError):
    """Refused: the scheduler holds as many jobs as it takes."""

    def __init__(self, jobs: int, retry_after: int):
        super().__init__(
            f"busy: {jobs} requests are waiting for the model; try again in {retry_after} s "
            "(`ragidx daemon status` shows them)"
        )
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    """One client's request, as the scheduler sees it."""

    client: str
    operation: str
    index: str = ""
    background: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
    number: int = 0
    started: float = field(default_factory=time.monotonic)
    slices: int = 0  # run so far
    model_seconds: float = 0.0
    state: str = "outside"  # "waiting" (a slice queued), "running" (on the model thread), "outside"
    admitted: bool = False  # it has queued a slice (and so counts against max_jobs)

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "job": self.number,
            "client": self.client,
            "operation": self.operation,
            "index": self.index,
            "state": self.state,
            "seconds": round(now - self.started, 2),
            "slices": self.slices,
            "model_seconds": round(self.model_seconds, 2),
        }


@dataclass(eq=False)
class Slice:
    """A piece of a job's model work: ``work()``, or with a batch ``key`` its ``item``, which
    ``merge`` answers together with the items of every other slice of that key waiting."""

    job: Job
    work: Callable[[], Any] | None = None
    key: Any = None
    item: Any = None
    merge: Callable[[list[Any]], list[Any]] | None = None
    done: Future[Any] = field(default_factory=Future)


class Scheduler:
    """Runs model work on its one thread, slice by slice, the least served job first (see the module)."""

    def __init__(self, max_jobs: int = MAX_JOBS, max_batch: int = MAX_BATCH):
        self.max_jobs = max_jobs
        self.max_batch = max_batch
        self._lock = threading.Condition()
        self._queues: collections.OrderedDict[str, collections.deque[Slice]] = collections.OrderedDict()
        self._jobs: list[Job] = []
        self._numbers = itertools.count(1)
        self._slice_seconds = collections.deque([SLICE_SECONDS], maxlen=32)  # recent slices' lengths
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the model thread once the slices queued are done (a process that makes a scheduler
        per request must not keep a thread per request), and wait for it, at most
        :data:`CLOSE_SECONDS`: a process that exits while that thread is inside the model is
        aborted by torch ("terminate called without an active exception")."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if not self.on_model_thread():
            self._thread.join(CLOSE_SECONDS)

    def on_model_thread(self) -> bool:
        return threading.current_thread() is self._thread

    @contextlib.contextmanager
    def job(
        self,
        client: str,
        operation: str,
        index: str = "",
        *,
        background: bool = False,
        cancel: threading.Event | None = None,
    ) -> Iterator[Job]:
        """A job for ``client`` while the block runs, admitted at its first slice (see :meth:`run`).
        ``cancel``: set when the client goes away."""
        with self._lock:
            job = Job(client, operation, index, background, cancel or threading.Event(), next(self._numbers))
            self._jobs.append(job)
        try:
            yield job
        finally:
            with self._lock:
                self._jobs.remove(job)
                self._drop_waiting(job)

    def run(self, job: Job, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``work(*args, **kwargs)`` on the model thread once its turn comes: its value, or its
        exception raised here; :class:`Cancelled` where ``job`` is cancelled first; :class:`Busy`
        where this is the job's first slice and ``max_jobs`` others hold the model (background
        jobs are never refused: they give way to everything). Called on the model thread itself
        (work that is already a slice), it runs at once."""
        if self.on_model_thread():
            return work(*args, **kwargs)
        return self._wait(self._queue(Slice(job, lambda: work(*args, **kwargs))))

    def run_batched(self, job: Job, key: Any, item: Any, merge: Callable[[list[Any]], list[Any]]) -> Any:
        """``item``'s answer from ``merge(items)``, called once on the model thread with the items
        of every slice of ``key`` waiting then (up to ``max_batch``); each answer is a value, or
        an exception that is raised in its own caller alone."""
        if self.on_model_thread():
            return _value(merge([item])[0])
        return self._wait(self._queue(Slice(job, key=key, item=item, merge=merge)))

    async def arun(self, job: Job, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`run` for async code: the event loop runs on while the work waits and runs."""
        return await asyncio.to_thread(self.run, job, work, *args, **kwargs)

    def status(self) -> dict[str, Any]:
        """Every job held, running first, then waiting, then the rest (each with its client)."""
        now = time.monotonic()
        order = {"running": 0, "waiting": 1, "outside": 2}
        with self._lock:
            admitted = [job for job in self._jobs if job.admitted]
            jobs = sorted(admitted, key=lambda job: (order[job.state], job.number))
            return {
                "jobs": [job.describe(now) for job in jobs],
                "max_jobs": self.max_jobs,
                "slice_seconds": round(self._typical_slice(), 3),
            }

    def _queue(self, piece: Slice) -> Slice:
        with self._lock:
            job = piece.job
            if job.cancel.is_set():
                raise Cancelled
            if not job.admitted and not job.background:
                held = sum(1 for other in self._jobs if other.admitted and not other.background)
                if held >= self.max_jobs:
                    raise Busy(held, self._retry_after(held))
            job.admitted = True
            piece.job.state = "waiting"
            self._queues.setdefault(piece.job.client, collections.deque()).append(piece)
            self._lock.notify_all()
        return piece

    def _wait(self, piece: Slice) -> Any:
        """The slice's answer; a job cancelled meanwhile loses its waiting slices (one already on
        the model thread finishes: a slice is short)."""
        while True:
            try:
                return piece.done.result(timeout=CANCEL_POLL_SECONDS)
            except concurrent.futures.CancelledError:
                raise Cancelled from None
            except concurrent.futures.TimeoutError:
                if piece.job.cancel.is_set():
                    with self._lock:
                        self._drop_waiting(piece.job)

    def _drop_waiting(self, job: Job) -> None:
        """Take ``job``'s slices out of the queue (under the lock), cancelling their futures."""
        queue = self._queues.get(job.client)
        if not queue:
            return
        for piece in [piece for piece in queue if piece.job is job]:
            queue.remove(piece)
            piece.done.cancel()
        if not queue:
            del self._queues[job.client]
        if job.state == "waiting":
            job.state = "outside"

    def _take(self) -> list[Slice]:
        """The next slice (under the lock), foreground before background: from the client whose
        waiting job has had the least model time, the first in turn among equals; that client
        then goes last. A new query (no model time yet) thus runs next whatever number of long
        jobs wait, and long jobs share the model between them. With a batch key, every other
        slice of that key waiting comes along."""
        for background in (False, True):
            heads = [(queue[0].job, client) for client, queue in self._queues.items()]
            candidates = [
                (job.model_seconds, client) for job, client in heads if job.background is background
            ]
            if candidates:
                client = min(candidates, key=lambda candidate: candidate[0])[1]  # the first of equals
                first = self._queues[client].popleft()
                self._queues.move_to_end(client)
                batch = [first, *self._same_key(first)] if first.key is not None else [first]
                for name in [name for name, left in self._queues.items() if not left]:
                    del self._queues[name]
                return batch
        return []

    def _same_key(self, first: Slice) -> list[Slice]:
        found: list[Slice] = []
        for queue in self._queues.values():
            for piece in [piece for piece in queue if piece.key == first.key]:
                if len(found) + 1 >= self.max_batch:
                    return found
                queue.remove(piece)
                found.append(piece)
        return found

    def _serve(self) -> None:
        while True:
            with self._lock:
                batch = self._take()
                while not batch:
                    if self._closing:
                        return
                    self._lock.wait()
                    batch = self._take()
                for piece in batch:
                    piece.job.state = "running"
            started = time.perf_counter()
            with on_idle_cores():
                _run(batch)
            seconds = time.perf_counter() - started
            with self._lock:
                self._slice_seconds.append(seconds)
                for piece in batch:
                    piece.job.slices += 1
                    piece.job.model_seconds += seconds / len(batch)
                    if piece.job.state == "running":
                        piece.job.state = "outside"

    def _typical_slice(self) -> float:
        return sorted(self._slice_seconds)[len(self._slice_seconds) // 2]

    def _retry_after(self, held: int) -> int:
        """Seconds until the jobs held are likely through: a slice or a few each."""
        return max(1, round(held * 4 * self._typical_slice()))


def _run(batch: Sequence[Slice]) -> None:
    """Run a slice, or a batch of slices of one key through its merge, and settle their futures
    (a slice taken from the queue is never cancelled: only waiting ones are)."""
    for piece in batch:
        piece.done.set_running_or_notify_cancel()
    first = batch[0]
    try:
        if first.merge is None:
            assert first.work is not None
            first.done.set_result(first.work())
            return
        answers = first.merge([piece.item for piece in batch])
    except BaseException as error:  # handed to the caller, raised in its thread
        for piece in batch:
            piece.done.set_exception(error)
        return
    for piece, answer in zip(batch, answers, strict=True):
        if isinstance(answer, BaseException):
            piece.done.set_exception(answer)
        else:
            piece.done.set_result(answer)


def _value(answer: Any) -> Any:
    if isinstance(answer, BaseException):
        raise answer
    return answer
