"""The per-user daemon: indexes and their models kept loaded for repeated CLI use.

``ragidx query`` (and ``ragidx ask``, ``ragidx embed --index``) send their request to it over a
Unix socket (:mod:`ragidx.app.daemon.client`) and print its answer, so only the first call pays for
imports, the tokenizer and the model. Each connection is served by a thread of its own; every use
of a model goes through one :class:`~ragidx.app.service.scheduler.Scheduler`, which runs it on one thread,
a slice at a time, the least served job first, so a long embed or a streamed answer holds nobody else up
for more than a slice, and a keyword search (or a hybrid one that weighs the vectors 0) never
waits for the model at all. Every request first follows the index at its path (a new generation,
or the folder deleted, rebuilt or swapped: see :meth:`Index.refresh`). It keeps at most
:data:`MAX_INDEXES` indexes open (the least recently used is closed), and exits after ``idle``
seconds without a request, or at once when its socket is gone or another daemon's has replaced
it (a daemon nobody can reach must not live on). It binds its socket before importing the model
stack, so a client can connect at once and wait for its answer. Nothing that changes an index
goes through it.

No client can stop it or hold it up: a request must arrive within :data:`REQUEST_SECONDS` of
connecting (a stalled connection delays nobody else: it waits in its own thread), a client that
goes away before its answer cancels its work (its connection is watched), and a client waiting
for the model hears a space every :data:`PULSE_SECONDS` (leading whitespace the JSON answer may
start with). A client judges the daemon by whether its process lives (``SO_PEERCRED`` gives its
pid), so a daemon too busy to pulse under load is waited for, not replaced.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ragidx.app.daemon.client import listen
from ragidx.app.daemon.command_server import CommandServer
from ragidx.app.retriever import Index
from ragidx.app.service.operations import dispatch
from ragidx.app.service.scheduler import Busy, Scheduler
from ragidx.app.service.served_index import ServedIndex
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.traced_readout import SETTLING_CALLS, SETTLING_TEXT

MAX_INDEXES = 2  # each holds its model in memory
MAX_REQUEST_BYTES = 16 * 2**20
MAX_CLIENTS = 64  # connections served at once; the next waits in the listen queue
REQUEST_SECONDS = 5.0  # for a client to send its whole request once connected
ANSWER_SECONDS = 30.0  # for a client to take its answer
PULSE_SECONDS = 1.0  # a waiting client hears from the daemon this often
WAKE_SECONDS = 0.1  # the main loop looks at the idle time, its socket, a stop and warm-up work this often
WATCH_SECONDS = 0.25  # a client that went away is noticed within this
STOP_SECONDS = 30.0  # a stopping daemon waits this long for the request in flight
# After an index's first query, while no request waits, its traced readout is settled one call at a
# time (traced_readout.SETTLING_CALLS), so these calls happen between the user's queries rather than
# in them. Only for an index whose searches embed their query: one that searches by keywords alone
# never loads its model.

IndexKey = tuple[str, str, str | None]  # folder, device, dtype


class Daemon:
    """Serves requests on ``path`` until ``idle`` seconds pass without one, a ``stop``, or its
    socket is gone; the ``command_server`` forked beside it (if any) ends with it."""

    def __init__(self, path: Path, idle: float, command_server: CommandServer | None = None):
        self.path = path
        self.idle = idle
        self.command_server = command_server
        self.started = time.time()
        self.served = 0
        self.open: collections.OrderedDict[IndexKey, ServedIndex] = collections.OrderedDict()
        self.opening = threading.Lock()  # the open indexes, opened and closed by request threads
        self.listener = listen(path)
        self.inode = path.stat().st_ino  # a later daemon's socket at the same path is not ours
        self.stopping = False
        self.scheduler = Scheduler()
        self.clients = threading.BoundedSemaphore(MAX_CLIENTS)
        self.counting = threading.Lock()  # for the two counts, kept by every connection's thread
        self.active = 0  # connections being served
        self.answering: set[threading.Thread] = set()  # connections whose request has arrived
        self.last_seen = time.monotonic()  # of the last request's end
        self.warming = threading.Lock()  # the two below, kept by request threads and the warm-up's
        self.cold: dict[IndexKey, int] = {}  # index -> warm-up calls left
        self.warm: set[IndexKey] = set()

    def run(self) -> None:
        self.listener.settimeout(WAKE_SECONDS)
        threading.Thread(target=self._warm_up, name="ragidx-warm-up", daemon=True).start()
        try:
            while not self.stopping and not self._idle_expired() and self._reachable():
                try:
                    connection, _ = self.listener.accept()
                except TimeoutError:
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

    def _reachable(self) -> bool:
        """Whether clients can still find this daemon: its socket file is still the one it made."""
        try:
            same = self.path.stat().st_ino == self.inode
        except OSError:
            same = False
        if not same:
            _log("its socket was removed or replaced by another daemon's: exiting")
        return same

    def _serve(self, connection: socket.socket) -> None:
        """One client's request and answer, in this connection's own thread; whatever the client
        does (stall, vanish, send garbage) ends here, logged in one line."""
        try:
            with connection:
                request = _read_request(connection, time.monotonic() + REQUEST_SECONDS)
                with self.counting:
                    self.answering.add(threading.current_thread())
                client = Client(connection)
                with client.pulsing(), client.watched():
                    answer = self.answer(request, client.event, client.gone, client.name)
                client.send(json.dumps(answer, ensure_ascii=False).encode("utf-8"))
                if client.gone.is_set():
                    _log("a client went away before its answer; its work was stopped")
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
        self,
        request: Any,
        event: Callable[[dict[str, Any]], None] = lambda found: None,
        gone: threading.Event | None = None,
        client: str = "a client",
    ) -> dict[str, Any]:
        """The answer to one parsed request; errors are answers too (the client prints them).
        ``event``: sends the client what a streamed request (``ask``) yields on the way; ``gone``:
        set once the client went away, which stops its work."""
        try:
            if not isinstance(request, dict):
                raise RagidxError("a daemon request is a JSON object")
            operation = request.get("op")
            if operation == "status":
                return self.status()
            if operation == "stop":
                self.stopping = True
                self._withdraw()  # before answering: a client told "stopped" finds no socket
                return {"stopped": True, "pid": os.getpid()}
            key = (os.path.realpath(request["index"]), request.get("device", "auto"), request.get("dtype"))
            served = self.index(key)
            with self.scheduler.job(client, str(operation), key[0], cancel=gone) as job:
                answer = dispatch(served, request, job, event)
            with self.warming:
                if key not in self.warm:
                    self.cold.setdefault(key, SETTLING_CALLS)
            return answer
        except Busy as error:
            return {"error": str(error), "retry_after": error.retry_after}
        except RagidxError as error:
            return {"error": str(error)}
        except Exception as error:  # the client prints it; the daemon goes on serving
            return {"error": f"{type(error).__name__}: {error}"}
        finally:
            self._count(served=1)

    def index(self, key: IndexKey) -> ServedIndex:
        """The open index (and its loaded model) for ``(folder, device, dtype)``, opened on first
        use and following the folder's current index; one that is gone is closed (its model
        freed) and reported as such."""
        folder, device, dtype = key
        with self.opening:
            if key not in self.open:
                self.open[key] = ServedIndex(Index.open(folder, device=device, dtype=dtype), self.scheduler)
                while len(self.open) > MAX_INDEXES:
                    self._forget(next(iter(self.open)))
            self.open.move_to_end(key)
            served = self.open[key]
        try:
            served.refresh()
        except RagidxError:
            with self.opening:
                if self.open.get(key) is served:
                    self._forget(key)
            raise
        return served

    def _forget(self, key: IndexKey) -> None:
        """Close an index (under ``opening``): its model is freed on the model's thread."""
        served = self.open.pop(key)
        with self.warming:
            self.cold.pop(key, None)
            self.warm.discard(key)
        with self.scheduler.job("daemon", "close", key[0]) as job:
            served.close(job)

    def _warm_up(self) -> None:
        """Settle the traced readouts of indexes that answered their first request and embed their
        queries, one call at a time while no request is being answered, on a thread of its own
        (background work: a request that arrives waits for one call at most, and connections are
        accepted meanwhile)."""
        while not self.stopping:
            time.sleep(WAKE_SECONDS)
            with self.warming:
                if not self.cold or self.active:
                    continue
                key, left = next(iter(self.cold.items()))
            served = self.open.get(key)
            try:
                if served is None or left == 0 or not served.embeds_queries():
                    self._warmed(key)
                    continue
                with self.scheduler.job("daemon", "warm-up", key[0], background=True) as job:
                    if not served.traces_queries(job):
                        self._warmed(key)
                        continue
                    served.embed([SETTLING_TEXT], "query", job)
            except Exception as error:  # the index went away, say: the next request says so
                _log(f"warming {key[0]} up failed ({type(error).__name__}: {error})")
                self._warmed(key)
                continue
            with self.warming:
                if key in self.cold:
                    self.cold[key] = left - 1

    def _warmed(self, key: IndexKey) -> None:
        with self.warming:
            self.cold.pop(key, None)
            self.warm.add(key)

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
                    "model_loaded": opened.index.model_loaded,
                    "answering": [name for name, _ in opened.index._generators],  # models kept to answer
                }
                for (index, device, dtype), opened in list(self.open.items())
            ],
            **self.scheduler.status(),
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
        with self.opening:
            for key in list(self.open):
                self._forget(key)


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
    :data:`ANSWER_SECONDS` (the pulse, a streamed request's events and the answer share it).
    ``gone`` is set once it went away (see :meth:`watched`); ``name`` says who it is (its pid)."""

    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.sending = threading.Lock()
        self.gone = threading.Event()
        self.name = f"pid {_peer_pid(connection) or '?'}"

    def send(self, data: bytes) -> None:
        with self.sending:
            self.connection.settimeout(ANSWER_SECONDS)
            self.connection.sendall(data)

    def event(self, found: dict[str, Any]) -> None:
        """One line of a streamed answer; a client that went away stops getting them (and its
        work is stopped: see :meth:`watched`)."""
        if self.gone.is_set():
            return
        try:
            self.send(json.dumps(found, ensure_ascii=False).encode("utf-8") + b"\n")
        except OSError:
            self.gone.set()

    def pulsing(self) -> contextlib.AbstractContextManager[None]:
        """While the block runs, send a space every :data:`PULSE_SECONDS` (leading whitespace the
        answer may start with); a client that went away ends the pulse."""

        def pulse(done: threading.Event) -> None:
            with contextlib.suppress(OSError):
                while not done.wait(PULSE_SECONDS):
                    self.send(b" ")

        return _beside(pulse)

    def watched(self) -> contextlib.AbstractContextManager[None]:
        """While the block runs, notice within :data:`WATCH_SECONDS` that the client closed its
        end (it sends nothing after its request, so its socket turns readable only at the end,
        or on a reset) and set :attr:`gone`, which cancels its work."""

        def watch(done: threading.Event) -> None:
            while not done.is_set():
                try:
                    readable = select.select([self.connection], [], [], WATCH_SECONDS)[0]
                    if readable and not self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                        self.gone.set()
                        return
                except (OSError, ValueError):  # reset, or closed under us
                    self.gone.set()
                    return
                if readable:
                    time.sleep(WATCH_SECONDS)  # bytes after the request: ignored

        return _beside(watch)


@contextlib.contextmanager
def _beside(work: Callable[[threading.Event], None]) -> Iterator[None]:
    """``work(done)`` on a thread of its own while the block runs; ``done`` is set at its end."""
    done = threading.Event()
    thread = threading.Thread(target=work, args=(done,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _peer_pid(connection: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (Linux's SO_PEERCRED)."""
    try:
        pid, _, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (OSError, AttributeError):
        return None
    return pid


def _log(message: str) -> None:
    """One line in the daemon's log (its stderr)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ragidx daemon {os.getpid()}: {message}", file=sys.stderr)
