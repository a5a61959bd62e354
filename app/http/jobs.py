"""HTTP requests as jobs of the scheduler (:mod:`ragidx.app.service.scheduler`), cancelled when their client
disconnects: ``ragidx serve``'s routes run their work through :func:`until_done`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from fastapi import Request

from ragidx.app.service.scheduler import Job, Scheduler

DISCONNECT_POLL_SECONDS = 0.5  # a client that went away is noticed within this
T = TypeVar("T")


def client_name(request: Request) -> str:
    """Who sent ``request``, for the scheduler's status."""
    return f"http {request.client.host}:{request.client.port}" if request.client else "http"


async def until_done(request: Request, scheduler: Scheduler, operation: str, work: Callable[[Job], T]) -> T:
    """``work(job)`` on a worker thread, as a job of this HTTP client: its value, or its error
    raised here. A client that disconnects meanwhile cancels the job within
    :data:`DISCONNECT_POLL_SECONDS` (its model work stops; a chat endpoint's request is closed)."""
    cancel = threading.Event()

    def run() -> T:
        with scheduler.job(client_name(request), operation, cancel=cancel) as job:
            return work(job)

    task = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if not task.done() and await request.is_disconnected():
                cancel.set()
        return task.result()
    finally:
        cancel.set()  # a handler cancelled by the server (the client went away) stops its job too
