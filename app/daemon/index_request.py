"""One request on an index, answered by the per-user daemon where one can be had, else here, through
the same table of operations (:mod:`ragidx.app.service.operations`) either way.

The CLI's ``query``, ``ask`` and ``embed --index`` and the ``llm`` plugin
(:mod:`ragidx.app.integrations.llm_plugin`) all run in short-lived processes, where loading the
model would cost seconds per call; the daemon holds it loaded (see :mod:`ragidx.app.daemon.server`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ragidx.app.daemon import address as daemon_address
from ragidx.app.daemon import client as daemon_client
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.hits import Found
from ragidx.indexer.search.options import SearchOptions

if TYPE_CHECKING:
    from ragidx.app.service.scheduler import Job
    from ragidx.app.service.served_index import ServedIndex

T = TypeVar("T")

Event = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class IndexRequest:
    """A request on an index: answered by the daemon where one can be had (started if none runs),
    else in this process, with the same result."""

    directory: str
    device: str
    dtype: str | None
    model: str | None
    strategy: str | None
    no_daemon: bool

    def answer(self, request: dict[str, Any], on_event: Event | None = None) -> dict[str, Any]:
        """The answer to ``request`` (an operation of :mod:`ragidx.app.service.operations`): the daemon's,
        or this process's where none can be had; ``on_event`` gets what a streamed one sends on
        the way. A daemon that stops after part of a streamed answer is reported, not asked again
        here: the part already printed would be printed twice."""
        asked = self._asked(request)
        answer = self._through_daemon(asked, on_event)
        if answer is not None:
            return answer
        from ragidx.app.service.operations import dispatch

        return self._here(
            asked, lambda served, job: dispatch(served, asked, job, on_event or (lambda found: None))
        )

    def search(self, query: str, options: dict[str, Any]) -> Found:
        """``Index.search(query, **options)``'s hits, and any build left pending: the daemon's,
        read back from its JSON, or this process's objects as they are."""
        asked = self._asked({"op": "search", "query": query, "options": options})
        answer = self._through_daemon(asked, None)
        if answer is not None:
            return Found.from_dict(answer)
        from ragidx.app.service.operations import prepare, search

        def searched(served: ServedIndex, job: Job) -> Found:
            prepare(served, asked)
            return search(served, query, SearchOptions.of(**options), job)

        return self._here(asked, searched)

    def _asked(self, request: dict[str, Any]) -> dict[str, Any]:
        return {
            **request,
            "index": self.directory,
            "device": self.device,
            "dtype": self.dtype,
            "model": self.model,
            "strategy": self.strategy,
        }

    def context(self, query: str, options: dict[str, Any], **wanted: Any) -> dict[str, Any]:
        """``Index.context(query, **options, **wanted)`` as a dict: the passages for a prompt
        (``ragidx query --context``, the ``llm`` plugin)."""
        request = {"op": "context", "query": query, "options": options, "context": wanted}
        return dict(self.answer(request)["context"])

    def _here(self, request: dict[str, Any], work: Callable[[ServedIndex, Job], T]) -> T:
        """``work``'s answer computed in this process, by the same operations the daemon runs."""
        from ragidx.app.retriever import Index
        from ragidx.app.service.scheduler import Scheduler
        from ragidx.app.service.served_index import ServedIndex

        with (
            Scheduler() as scheduler,
            Index.open(self.directory, device=self.device, dtype=self.dtype) as index,
        ):
            served = ServedIndex(index, scheduler)
            with scheduler.job(f"pid {os.getpid()}", str(request.get("op"))) as job:
                return work(served, job)

    def _through_daemon(self, request: dict[str, Any], on_event: Event | None) -> dict[str, Any] | None:
        if not daemon_address.wanted(self.no_daemon):
            return None
        try:
            answer = daemon_client.ask(request, on_event=on_event)
        except daemon_address.DaemonUnavailable as error:
            if error.partial:
                raise RagidxError(
                    f"{error} after part of its answer (above): that part is all there is; ask again"
                ) from None
            return None
        except (OSError, ValueError):
            return None
        if "error" in answer:
            raise RagidxError(answer["error"])
        return answer
