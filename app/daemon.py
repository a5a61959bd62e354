"""The per-user daemon: indexes and their models kept loaded for repeated CLI use.

``ragidx query`` (and ``ragidx embed --index``) send their request to it over a Unix socket
(:mod:`ragidx.app.daemon_client`) and print its answer, so only the first call pays for imports,
the tokenizer and the model. It answers one request at a time (a strategy re-routes the model's
attention for a forward pass), follows new generations as ``serve`` does (each search reads the
newest committed one), keeps at most :data:`MAX_INDEXES` indexes open (the least recently used is
closed), and exits after ``idle`` seconds without a request. It binds its socket before importing
the model stack, so a client can connect at once and wait for its answer. Nothing that changes an
index goes through it.
"""

from __future__ import annotations

import collections
import json
import os
import select
import socket
import time
from pathlib import Path
from typing import Any

from ragidx.app.retriever import Index
from ragidx.indexer.errors import RagidxError

MAX_INDEXES = 2  # each holds its model in memory
MAX_REQUEST_BYTES = 16 * 2**20
# After an index's first query, while no request waits, this many one-text embeddings settle its
# traced readout: the trace records at the second one-row readout and TorchScript's executor
# profiles and optimises over the next two replays (each slower than a settled one), so these
# happen between the user's queries rather than in them.
WARM_UP_CALLS = 3
WARM_UP_TEXT = "what does this index hold about the subject"


class Daemon:
    """Serves requests on ``path`` until ``idle`` seconds pass without one, or a ``stop``."""

    def __init__(self, path: Path, idle: float):
        self.path = path
        self.idle = idle
        self.started = time.time()
        self.served = 0
        self.open: collections.OrderedDict[tuple[str, str, str | None], Any] = collections.OrderedDict()
        self.listener = _listen(path)
        self.inode = path.stat().st_ino  # a later daemon's socket at the same path is not ours
        self.stopping = False
        self.cold: dict[tuple[str, str, str | None], int] = {}  # index -> warm-up calls left
        self.warm: set[tuple[str, str, str | None]] = set()

    def run(self) -> None:
        self.listener.settimeout(1.0)
        last = time.monotonic()
        try:
            while not self.stopping and time.monotonic() - last < self.idle:
                try:
                    connection, _ = self.listener.accept()
                except TimeoutError:
                    continue
                with connection:
                    connection.settimeout(None)
                    self._answer(connection)
                if not self.stopping:
                    self._warm_up_while_idle()
                last = time.monotonic()
        finally:
            self.close()

    def _answer(self, connection: socket.socket) -> None:
        reader = connection.makefile("rb")
        line = reader.readline(MAX_REQUEST_BYTES)
        try:
            answer = self.handle(json.loads(line))
        except RagidxError as error:
            answer = {"error": str(error)}
        except Exception as error:  # the client prints it; the daemon goes on serving
            answer = {"error": f"{type(error).__name__}: {error}"}
        self.served += 1
        connection.sendall(json.dumps(answer, ensure_ascii=False).encode("utf-8"))

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request: ``search``, ``embed``, ``status`` or ``stop``."""
        operation = request.get("op")
        if operation == "status":
            return self.status()
        if operation == "stop":
            self.stopping = True
            self._withdraw()  # before answering: a client told "stopped" finds no socket
            return {"stopped": True, "pid": os.getpid()}
        key = (os.path.realpath(request["index"]), request.get("device", "auto"), request.get("dtype"))
        index = self.index(key)
        index.check_compatible(request.get("model"), request.get("strategy"))
        if operation == "search":
            answer = {
                "hits": [
                    hit.to_dict() for hit in index.search(request["query"], **request.get("options", {}))
                ]
            }
        elif operation == "embed":
            answer = {"vectors": index.embed(request["texts"], request.get("role", "query")).tolist()}
        else:
            raise RagidxError(f"unknown daemon request {operation!r}")
        if key not in self.warm:
            self.cold.setdefault(key, WARM_UP_CALLS)
        return answer

    def index(self, key: tuple[str, str, str | None]) -> Any:
        """The open index (and its loaded model) for ``(folder, device, dtype)``; opened on first use."""
        folder, device, dtype = key
        if key not in self.open:
            self.open[key] = Index.open(folder, device=device, dtype=dtype)
            while len(self.open) > MAX_INDEXES:
                closed, index = self.open.popitem(last=False)
                index.close()
                self.cold.pop(closed, None)
                self.warm.discard(closed)
        self.open.move_to_end(key)
        return self.open[key]

    def _warm_up_while_idle(self) -> None:
        """Settle the traced readouts of indexes that answered their first request, one call at a
        time, as long as no request is waiting (one that arrives waits for one call at most)."""
        while self.cold and not select.select([self.listener], [], [], 0)[0]:
            key, left = next(iter(self.cold.items()))
            index = self.open[key]
            if left == 0 or index.strategy.one_row is None:
                del self.cold[key]
                self.warm.add(key)
                continue
            index.embed([WARM_UP_TEXT])
            self.cold[key] = left - 1

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": str(self.path),
            "uptime_seconds": round(time.time() - self.started, 1),
            "requests": self.served,
            "idle_timeout_seconds": self.idle,
            "indexes": [
                {"index": index, "device": device, "dtype": dtype} for index, device, dtype in self.open
            ],
        }

    def _withdraw(self) -> None:
        """Remove this daemon's socket file, unless another daemon's has replaced it."""
        try:
            if self.path.stat().st_ino == self.inode:
                self.path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.listener.close()
        self._withdraw()
        for index in self.open.values():
            index.close()


def _listen(path: Path) -> socket.socket:
    """Listen at ``path``, appearing there only once listening (a socket file that refuses
    connections is taken for a dead daemon's); only this user may connect (0600)."""
    pending = path.with_name(f".{os.getpid()}")
    pending.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(pending))
    os.chmod(pending, 0o600)
    listener.listen(64)
    os.replace(pending, path)
    return listener
