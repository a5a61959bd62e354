"""The per-user daemon: indexes and their models kept loaded for repeated CLI use.

``ragidx query`` (and ``ragidx embed --index``) send their request to it over a Unix socket
(:mod:`ragidx.app.daemon_client`) and print its answer, so only the first call pays for imports,
the tokenizer and the model. Each connection is served by a thread of its own, but the model
answers one request at a time (a strategy re-routes the model's attention for a forward pass),
always on the same thread (:class:`~ragidx.app.model_thread.ModelThread`, which says why).
Gemma 3's hybrid search, answered in a new thread per request, took 43-44 ms, on one model thread
35-37 ms, as on the main thread alone (2 cores held to AVX2; ``tests/benchmarks/thread_pools.py``).
Every request first follows the index at its path (a new generation, or the folder deleted,
rebuilt or swapped: see :meth:`Index.refresh`). It keeps at most :data:`MAX_INDEXES` indexes open
(the least recently used is closed), and exits after ``idle`` seconds without a request. It binds
its socket before importing the model stack, so a client can connect at once and wait for its
answer. Nothing that changes an index goes through it.

No client can stop it or hold it up: a request must arrive within :data:`REQUEST_SECONDS` of
connecting (a stalled connection delays nobody else: it waits in its own thread), a client that
goes away before its answer costs only that answer, and a client waiting for the model hears a
space every :data:`PULSE_SECONDS` (leading whitespace the JSON answer may start with), so it can
tell a busy daemon from a hung one.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ragidx.app.command_server import CommandServer
from ragidx.app.daemon_client import listen
from ragidx.app.model_thread import ModelThread
from ragidx.app.retriever import Index
from ragidx.indexer.errors import RagidxError

MAX_INDEXES = 2  # each holds its model in memory
MAX_REQUEST_BYTES = 16 * 2**20
MAX_CLIENTS = 64  # connections served at once; the next waits in the listen queue
REQUEST_SECONDS = 5.0  # for a client to send its whole request once connected
ANSWER_SECONDS = 30.0  # for a client to take its answer
PULSE_SECONDS = 1.0  # a waiting client hears from the daemon this often
WAKE_SECONDS = 0.1  # the main loop looks at the idle time, a stop and warm-up work this often
STOP_SECONDS = 30.0  # a stopping daemon waits this long for the request in flight
# After an index's first query, while no request waits, this many one-text embeddings settle its
# traced readout: the trace records at the second one-row readout and TorchScript's executor
# profiles and optimises over the next two replays (each slower than a settled one), so these
# happen between the user's queries rather than in them.
WARM_UP_CALLS = 3
WARM_UP_TEXT = "what does this index hold about the subject"

IndexKey = tuple[str, str, str | None]  # folder, device, dtype


class Daemon:
    """Serves requests on ``path`` until ``idle`` seconds pass without one, or a ``stop``; the
    ``command_server`` forked beside it (if any) ends with it."""

    def __init__(self, path: Path, idle: float, command_server: CommandServer | None = None):
        self.path = path
        self.idle = idle
        self.command_server = command_server
        self.started = time.time()
        self.served = 0
        self.open: collections.OrderedDict[IndexKey, Index] = collections.OrderedDict()
        self.listener = listen(path)
        self.inode = path.stat().st_ino  # a later daemon's socket at the same path is not ours
        self.stopping = False
        self.model = threading.Lock()  # one request at a time uses the open indexes and models
        self.model_thread = ModelThread()  # ... and all of them on this thread
        self.clients = threading.BoundedSemaphore(MAX_CLIENTS)
        self.counting = threading.Lock()  # for the two counts, kept by every connection's thread
        self.active = 0  # connections being served
        self.answering: set[threading.Thread] = set()  # connections whose request has arrived
        self.last_seen = time.monotonic()  # of the last request's end
        self.cold: dict[IndexKey, int] = {}  # index -> warm-up calls left
        self.warm: set[IndexKey] = set()

    def run(self) -> None:
        self.listener.settimeout(WAKE_SECONDS)
        try:
            while not self.stopping and not self._idle_expired():
                try:
                    connection, _ = self.listener.accept()
                except TimeoutError:
                    self._warm_up_while_idle()
                    continue
                while not self.clients.acquire(timeout=PULSE_SECONDS):
                    if self.stopping:
                        connection.close()
                        return
                self._count(active=1)
                threading.Thread(target=self._serve, args=(connection,), daemon=True).start()
        finally:
            self.close()

    def _idle_expired(self) -> bool:
        return self.active == 0 and time.monotonic() - self.last_seen >= self.idle

    def _serve(self, connection: socket.socket) -> None:
        """One client's request and answer, in this connection's own thread; whatever the client
        does (stall, vanish, send garbage) ends here, logged in one line."""
        try:
            with connection:
                request = _read_request(connection, time.monotonic() + REQUEST_SECONDS)
                with self.counting:
                    self.answering.add(threading.current_thread())
                client = Client(connection)
                with client.pulsing():
                    answer = self.answer(request, client.event)
                client.send(json.dumps(answer, ensure_ascii=False).encode("utf-8"))
        except TimeoutError:
            _log("a client sent no whole request (or took no answer) in time; its connection was closed")
        except OSError as error:  # BrokenPipeError, ConnectionResetError: the client went away
            _log(f"a client went away before its answer ({type(error).__name__})")
        except ValueError as error:
            _log(f"a request was refused: {error}")
        finally:
            with self.counting:
                self.answering.discard(threading.current_thread())
            self.last_seen = time.monotonic()
            self._count(active=-1)
            self.clients.release()

    def _count(self, active: int = 0, served: int = 0) -> None:
        with self.counting:
            self.active += active
            self.served += served

    def answer(
        self, request: Any, event: Callable[[dict[str, Any]], None] = lambda found: None
    ) -> dict[str, Any]:
        """The answer to one parsed request; errors are answers too (the client prints them).
        ``event``: sends the client what a streamed request (``ask``) yields on the way."""
        try:
            if not isinstance(request, dict):
                raise RagidxError("a daemon request is a JSON object")
            if request.get("op") in ("status", "stop"):
                return self.handle(request)
            with self.model:
                return self.model_thread.run(self.handle, request, event)
        except RagidxError as error:
            return {"error": str(error)}
        except Exception as error:  # the client prints it; the daemon goes on serving
            return {"error": f"{type(error).__name__}: {error}"}
        finally:
            self._count(served=1)

    def handle(
        self, request: dict[str, Any], event: Callable[[dict[str, Any]], None] = lambda found: None
    ) -> dict[str, Any]:
        """One request: ``search``, ``context``, ``ask`` (its answer streamed as ``{"text": ...}``
        events), ``embed``, ``status`` or ``stop`` (all but the last two holding the model's lock)."""
        operation = request.get("op")
        if operation == "status":
            return self.status()
        if operation == "stop":
            self.stopping = True
            self._withdraw()  # before answering: a client told "stopped" finds no socket
            return {"stopped": True, "pid": os.getpid()}
        if operation not in ("search", "context", "ask", "embed"):
            raise RagidxError(f"unknown daemon request {operation!r}")
        key = (os.path.realpath(request["index"]), request.get("device", "auto"), request.get("dtype"))
        index = self.index(key)
        index.check_compatible(request.get("model"), request.get("strategy"))
        options = request.get("options", {})
        if operation == "search":
            answer: dict[str, Any] = {
                "hits": [hit.to_dict() for hit in index.search(request["query"], **options)]
            }
        elif operation == "context":
            context = index.context(request["query"], **options, **request.get("context", {}))
            answer = {"context": context.to_dict()}
        elif operation == "ask":
            asked = request.get("ask", {})
            found = index.ask(
                request["query"], **options, **asked, on_text=lambda text: event({"text": text})
            )
            answer = {"answer": found.to_dict()}
        else:
            answer = {"vectors": index.embed(request["texts"], request.get("role", "query")).tolist()}
        if key not in self.warm:
            self.cold.setdefault(key, WARM_UP_CALLS)
        return answer

    def index(self, key: IndexKey) -> Index:
        """The open index (and its loaded model) for ``(folder, device, dtype)``, opened on first
        use and following the folder's current index; one that is gone is closed (its model
        freed) and reported as such."""
        folder, device, dtype = key
        if key not in self.open:
            self.open[key] = Index.open(folder, device=device, dtype=dtype)
            while len(self.open) > MAX_INDEXES:
                self._forget(next(iter(self.open)))
        self.open.move_to_end(key)
        try:
            self.open[key].refresh()
        except RagidxError:
            self._forget(key)
            raise
        return self.open[key]

    def _forget(self, key: IndexKey) -> None:
        self.open.pop(key).close()
        self.cold.pop(key, None)
        self.warm.discard(key)

    def _warm_up_while_idle(self) -> None:
        """Settle the traced readouts of indexes that answered their first request, one call at a
        time, as long as no request is waiting (one that arrives waits for one call at most)."""
        while self.cold and self.active == 0 and not select.select([self.listener], [], [], 0)[0]:
            if not self.model.acquire(blocking=False):
                return
            try:
                key, left = next(iter(self.cold.items()))
                index = self.open.get(key)
                if index is None or left == 0 or index.strategy.one_row is None:
                    del self.cold[key]
                    self.warm.add(key)
                    continue
                self.model_thread.run(index.embed, [WARM_UP_TEXT])
                self.cold[key] = left - 1
            finally:
                self.model.release()

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": str(self.path),
            "uptime_seconds": round(time.time() - self.started, 1),
            "requests": self.served,
            "idle_timeout_seconds": self.idle,
            "command_server": None
            if self.command_server is None
            else {"pid": self.command_server.pid, "socket": str(self.command_server.path)},
            "indexes": [
                {
                    "index": index,
                    "device": device,
                    "dtype": dtype,
                    "answering": [name for name, _ in opened._generators],  # models kept to answer
                }
                for (index, device, dtype), opened in list(self.open.items())
            ],
        }

    def _withdraw(self) -> None:
        """Remove this daemon's socket file, unless another daemon's has replaced it, and stop its
        command server."""
        if self.command_server is not None:
            self.command_server.stop()
        try:
            if self.path.stat().st_ino == self.inode:
                self.path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Stop listening; close the indexes once every request that arrived (the ``stop``
        itself among them) is answered, or after :data:`STOP_SECONDS`, when the process exits
        anyway. Connections still sending their request are not waited for."""
        self.listener.close()
        self._withdraw()
        deadline = time.monotonic() + STOP_SECONDS
        with self.counting:
            arrived = list(self.answering)
        for thread in arrived:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.model.acquire(timeout=max(0.0, deadline - time.monotonic())):
            for index in self.open.values():
                self.model_thread.run(index.close)


def _read_request(connection: socket.socket, deadline: float) -> Any:
    """The JSON request: one line, all of it before ``deadline`` (a client trickling bytes is
    cut off as surely as a silent one); :class:`ValueError` when too long or not JSON."""
    received = bytearray()
    while b"\n" not in received:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        connection.settimeout(left)
        chunk = connection.recv(1 << 16)
        if not chunk:
            break
        received += chunk
        if len(received) > MAX_REQUEST_BYTES:
            raise ValueError(f"a request is longer than {MAX_REQUEST_BYTES} bytes")
    line = bytes(received).split(b"\n", 1)[0]
    try:
        return json.loads(line)
    except ValueError:
        raise ValueError("a request is not JSON") from None


class Client:
    """A connected client: what is sent to it goes whole, one message at a time, within
    :data:`ANSWER_SECONDS` (the pulse, a streamed request's events and the answer share it)."""

    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.sending = threading.Lock()
        self.gone = False

    def send(self, data: bytes) -> None:
        with self.sending:
            self.connection.settimeout(ANSWER_SECONDS)
            self.connection.sendall(data)

    def event(self, found: dict[str, Any]) -> None:
        """One line of a streamed answer; a client that went away stops getting them (the work
        goes on, and its answer is dropped)."""
        if self.gone:
            return
        try:
            self.send(json.dumps(found, ensure_ascii=False).encode("utf-8") + b"\n")
        except OSError:
            self.gone = True

    @contextlib.contextmanager
    def pulsing(self) -> Iterator[None]:
        """While the block runs, send a space every :data:`PULSE_SECONDS` (leading whitespace the
        answer may start with); a client that went away ends the pulse."""
        done = threading.Event()

        def pulse() -> None:
            with contextlib.suppress(OSError):
                while not done.wait(PULSE_SECONDS):
                    self.send(b" ")

        beat = threading.Thread(target=pulse, daemon=True)
        beat.start()
        try:
            yield
        finally:
            done.set()
            beat.join()


def _log(message: str) -> None:
    """One line in the daemon's log (its stderr)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ragidx daemon {os.getpid()}: {message}", file=sys.stderr)
