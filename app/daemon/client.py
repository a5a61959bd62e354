"""Talking to the per-user ragidx daemon (see :mod:`ragidx.app.daemon.server`), without loading anything.

A search tool runs many times a minute, and each ``ragidx query`` used to pay for importing
torch, loading a tokenizer and a model: seconds before the first result. The daemon keeps
indexes and their models loaded; the CLI sends it one JSON request over a Unix socket and prints
the answer. This module is what the CLI needs for that, and it imports nothing heavy: the socket
path, starting a daemon when none answers, one request and its reply.

Where the socket lives is :mod:`ragidx.app.daemon.address`'s (the console script reads it on
every query); the socket itself is 0600.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragidx.app.daemon import address as daemon_address
from ragidx.app.daemon.address import IDLE_VARIABLE, SILENCE_VARIABLE, DaemonUnavailable
from ragidx.indexer.errors import RagidxError

DEFAULT_IDLE_SECONDS = 600
START_SECONDS = 60.0  # for a new daemon to listen (it binds before importing the model stack)
# A daemon whose process lives is waited for, however busy (a daemon loading a model on a loaded
# machine may not get to send its pulse for many seconds); one silent this long (no answer, not
# even the pulse it sends while it works) is taken for hung: the client stops it, so that no
# second daemon ever serves the same socket, and answers in its own process.
SILENCE_SECONDS = 60.0
LIVENESS_SECONDS = 1.0  # a silent daemon's process is looked at this often
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


class NoDaemonRunning(DaemonUnavailable):
    """None listens (and none was to be started)."""


def idle_seconds() -> float:
    """How long a daemon waits for work before it exits: ``$RAGIDX_DAEMON_IDLE`` (see
    :func:`duration`), 10 minutes unless set."""
    return duration(IDLE_VARIABLE, DEFAULT_IDLE_SECONDS)


def silence_seconds() -> float:
    """How long a client waits on a live daemon that sends nothing before it takes it for hung,
    stops it and answers in its own process: ``$RAGIDX_DAEMON_SILENCE`` (see :func:`duration`),
    60 s unless set."""
    return duration(SILENCE_VARIABLE, SILENCE_SECONDS)


def duration(variable: str, default: float) -> float:
    """The environment ``variable`` in seconds, or with a unit (``90s``, ``10m``, ``1h``); a value
    that is not a positive duration is refused in one line."""
    given = os.environ.get(variable, "").strip()
    if not given:
        return float(default)
    number, unit = (given[:-1], given[-1]) if given[-1:].lower() in DURATION_UNITS else (given, "s")
    try:
        seconds = float(number) * DURATION_UNITS[unit.lower()]
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise RagidxError(
            f"{variable}={given!r} is not a duration: give seconds (600) or a number with s, m or h (10m)"
        )
    return seconds


def ask(
    request: dict[str, Any], start: bool = True, on_event: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Send ``request`` to this user's daemon and return its answer, starting a daemon first when
    none answers (and ``start``); :class:`DaemonUnavailable` when none can be had. ``on_event``
    gets each line a streamed request sends before its answer."""
    if start:
        idle_seconds()  # a setting the daemon would die of is refused here, in one line
    silence = silence_seconds()
    path = Path(daemon_address.socket_path())
    connection = _connect(path)
    if connection is None:
        if not start:
            raise NoDaemonRunning("no daemon is running")
        connection = _start(path)
    daemon = Peer(connection, path)
    with connection:
        connection.sendall(json.dumps(request).encode() + b"\n")
        answer = daemon.received(on_event, silence).strip()
    if not answer:
        raise DaemonUnavailable("the daemon stopped while answering", daemon.partial)
    return json.loads(answer)


class Peer:
    """The daemon at the other end of a connection: its pid (``SO_PEERCRED``), the socket file it
    listens on, and whether it has sent part of a streamed answer."""

    def __init__(self, connection: socket.socket, path: Path):
        self.connection = connection
        self.path = path
        self.pid = _peer_pid(connection)
        self.inode: int | None = None
        with contextlib.suppress(OSError):
            self.inode = path.stat().st_ino  # the socket file connected to (a newer one may replace it)
        self.partial = False

    def received(self, on_event: Callable[[dict[str, Any]], None] | None, silence: float) -> bytes:
        """Everything the daemon sends until it closes: each whole line (a streamed event) goes to
        ``on_event`` as it comes; what is left after the last line is the answer. A daemon whose
        process is gone is reported at once; one that lives is waited for until ``silence``
        seconds pass without a byte, then stopped (see :data:`SILENCE_SECONDS`)."""
        pending = bytearray()
        heard = time.monotonic()
        self.connection.settimeout(LIVENESS_SECONDS)
        while True:
            try:
                chunk = self.connection.recv(1 << 16)
            except TimeoutError:
                if not self.alive():
                    raise DaemonUnavailable("the daemon stopped while answering", self.partial) from None
                if time.monotonic() - heard >= silence:
                    self.stop_hung()
                    raise DaemonUnavailable(
                        f"the daemon was silent for {silence:g} s, so it was stopped", self.partial
                    ) from None
                continue
            except ConnectionResetError:
                raise DaemonUnavailable("the daemon stopped while answering", self.partial) from None
            if not chunk:
                return bytes(pending)
            heard = time.monotonic()
            pending += chunk
            if on_event is not None and b"\n" in chunk:
                *lines, rest = bytes(pending).split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    if line.strip():
                        self.partial = True
                        on_event(json.loads(line))

    def alive(self) -> bool:
        if self.pid is None:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop_hung(self) -> None:
        """Stop a daemon that stays silent though it lives (hung, or stopped by a signal) and remove
        its socket, so the next command starts one that answers: there is never a second daemon
        beside a hung one. A newer daemon's socket at the same path is left alone."""
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino != self.inode:
                return
            if self.pid is not None and self.pid != os.getpid():
                os.kill(self.pid, signal.SIGKILL)
            self.path.unlink()


def _peer_pid(connection: socket.socket) -> int | None:
    """The pid of the process listening at the other end (Linux's ``SO_PEERCRED``)."""
    try:
        pid, _, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (OSError, AttributeError):
        return None
    return pid if pid > 0 else None


def _connect(path: Path) -> socket.socket | None:
    """A connection to the daemon at ``path``, or None where none listens (a socket file left
    by a daemon that died is removed)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(START_SECONDS)
    try:
        connection.connect(str(path))
    except (FileNotFoundError, TimeoutError):  # none there, or one that accepts nobody (hung)
        connection.close()
        return None
    except ConnectionRefusedError:
        connection.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    return connection


def listen(path: Path) -> socket.socket:
    """Listen at ``path``, appearing there only once listening (a socket file that refuses
    connections is taken for a dead daemon's); only this user may connect (0600)."""
    pending = path.with_name(f".{os.getpid()}{path.suffix}")
    pending.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(pending))
    os.chmod(pending, 0o600)
    listener.listen(64)
    os.replace(pending, path)
    return listener


def _start(path: Path) -> socket.socket:
    """Start a daemon for ``path`` (one at a time: two clients starting at once share it) and
    connect to it as soon as it listens."""
    import subprocess  # here, not at the top: a query to a running daemon never starts one

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection = _connect(path)
        if connection is not None:  # another client started it meanwhile
            return connection
        log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the daemon
        command = [
            sys.executable,
            "-m",
            "ragidx",
            "daemon",
            "run",
            "--socket",
            str(path),
        ]
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and child.poll() is None:
            connection = _connect(path)
            if connection is not None:
                return connection
            time.sleep(0.02)
    ended = "exited at start" if child.poll() is not None else "did not start"
    raise DaemonUnavailable(f"the daemon {ended} (see {path.with_suffix('.log')})")
