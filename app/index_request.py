"""One request on an index, answered by the per-user daemon where one can be had, else here.

The CLI's ``query``, ``ask`` and ``embed --index`` and the ``llm`` plugin
(:mod:`ragidx.app.integrations.llm_plugin`) all run in short-lived processes, where loading the
model would cost seconds per call; the daemon holds it loaded (see :mod:`ragidx.app.daemon`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ragidx.app as api  # its Index is imported on first use: the model stack, where no daemon answers
from ragidx.app import daemon_address, daemon_client
from ragidx.indexer.errors import RagidxError

if TYPE_CHECKING:
    from ragidx.app.retriever import Index


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

    def answer(
        self,
        request: dict[str, Any],
        local: Callable[[Index], dict[str, Any]],
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The daemon's answer to ``request`` (``on_event`` gets what a streamed one sends on the
        way), or ``local(index)`` on the index opened here."""
        answer = self._through_daemon(
            {
                **request,
                "index": self.directory,
                "device": self.device,
                "dtype": self.dtype,
                "model": self.model,
                "strategy": self.strategy,
            },
            on_event,
        )
        if answer is not None:
            return answer
        with api.Index.open(self.directory, device=self.device, dtype=self.dtype) as index:
            index.check_compatible(self.model, self.strategy)
            return local(index)

    def context(self, query: str, options: dict[str, Any], **wanted: Any) -> dict[str, Any]:
        """``Index.context(query, **options, **wanted)`` as a dict: the passages for a prompt
        (``ragidx query --context``, the ``llm`` plugin)."""
        request = {"op": "context", "query": query, "options": options, "context": wanted}

        def local(index: Index) -> dict[str, Any]:
            return {"context": index.context(query, **options, **wanted).to_dict()}

        return dict(self.answer(request, local)["context"])

    def _through_daemon(
        self, request: dict[str, Any], on_event: Callable[[dict[str, Any]], None] | None
    ) -> dict[str, Any] | None:
        if not daemon_address.wanted(self.no_daemon):
            return None
        try:
            answer = daemon_client.ask(request, on_event=on_event)
        except (daemon_address.DaemonUnavailable, OSError, ValueError):
            return None
        if "error" in answer:
            raise RagidxError(answer["error"])
        return answer
