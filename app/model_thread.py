"""One thread for all of a server's model work: the daemon's, the HTTP API's, the MCP server's and
each LangChain or LlamaIndex adapter's (frameworks call from pools of threads).

torch's OpenMP keeps a pool of workers for each thread that runs an operator. Once a process
has more of them than cores (a model loaded on one thread and used on others, or a request per
thread), they stop spinning between operators and sleep, and every operator pays to wake them.
Gemma 3 on 2 cores of an AMD EPYC with avx512_bf16 held to AVX2 (commits 45814bd to 561ddf8,
``tests/benchmarks/thread_pools.py``): the daemon's hybrid search took 43-44 ms on each request's
thread, 35-37 ms on one model thread; one text's embedding through the HTTP API 47-49 ms loaded
on the main thread and run on the request's, 37-42 ms on one model thread; LangChain's
``ainvoke`` 42-53 ms searched on LangChain's threads, 34-41 ms on one model thread. So a server
loads, runs and closes its models on one :class:`ModelThread`, in turn, which also keeps two
forwards from interleaving (a strategy re-routes the model's attention for a forward pass).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any

# result, work, its positional and keyword arguments
Call = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ModelThread:
    """The one thread that runs every call given to it, in turn. A daemon thread: a call that
    never returns does not keep the process from exiting."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Call] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="ragidx-model", daemon=True).start()

    def submit(self, work: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Queue ``work(*args, **kwargs)`` to run on this thread once the calls before it are done;
        the future holds its value or its exception."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.calls.put((done, work, args, kwargs))
        return done

    def run(self, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``work(*args, **kwargs)`` on this thread: its value, or its exception raised here."""
        return self.submit(work, *args, **kwargs).result()

    async def arun(self, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`run` for async code: the event loop runs on while the work waits and runs."""
        return await asyncio.wrap_future(self.submit(work, *args, **kwargs))

    def _serve(self) -> None:
        while True:
            done, work, args, kwargs = self.calls.get()
            try:
                done.set_result(work(*args, **kwargs))
            except BaseException as error:  # raised again in the caller's thread
                done.set_exception(error)
