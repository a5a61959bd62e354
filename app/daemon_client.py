"""Talking to the per-user ragidx daemon (see :mod:`ragidx.app.daemon`), without loading anything.

A search tool runs many times a minute, and each ``ragidx query`` used to pay for importing
torch, loading a tokenizer and a model: seconds before the first result. The daemon keeps
indexes and their models loaded; the CLI sends it one JSON request over a Unix socket and prints
the answer. This module is what the CLI needs for that, and it imports nothing heavy: the socket
path, starting a daemon when none answers, one request and its reply.

Where the socket lives is :mod:`ragidx.app.daemon_address`'s (the console script reads it on
every query); the socket itself is 0600.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragidx.app import daemon_address
from ragidx.app.daemon_address import IDLE_VARIABLE, SILENCE_VARIABLE, DaemonUnavailable
from ragidx.indexer.errors import RagidxError

DEFAULT_IDLE_SECONDS = 600
START_SECONDS = 60.0  # for a new daemon to listen (it binds before importing the model stack)
# A daemon silent this long (no answer, not even the pulse it sends while it works) is given up
# on, and the command answers in its own process: a daemon that hangs costs a query this much.
SILENCE_SECONDS = 15.0
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


class NoDaemonRunning(DaemonUnavailable):
    """None listens (and none was to be started)."""


def idle_seconds() -> float:
    """How long a daemon waits for work before it exits: ``$RAGIDX_DAEMON_IDLE`` (see
    :func:`duration`), 10 minutes unless set."""
    return duration(IDLE_VARIABLE, DEFAULT_IDLE_SECONDS)


def silence_seconds() -> float:
    """How long a client waits on a daemon that sends nothing (a hung one) before it answers in
    its own process: ``$RAGIDX_DAEMON_SILENCE`` (see :func:`duration`), 15 s unless set."""
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
    connection = _connect(path, silence)
    if connection is None:
        if not start:
            raise NoDaemonRunning("no daemon is running")
        connection = _start(path, silence)
    listening = None
    with contextlib.suppress(OSError):
        listening = path.stat().st_ino  # the socket file connected to (a newer one may replace it)
    with connection:
        try:
            connection.sendall(json.dumps(request).encode() + b"\n")
            answer = _received(connection, on_event).strip()
        except TimeoutError:
            _abandon(path, listening)
            raise DaemonUnavailable(f"the daemon was silent for {silence:g} s") from None
    if not answer:
        raise DaemonUnavailable("the daemon closed the connection without an answer")
    return json.loads(answer)


def _received(connection: socket.socket, on_event: Callable[[dict[str, Any]], None] | None) -> bytes:
    """Everything the daemon sends until it closes: each whole line (a streamed event) goes to
    ``on_event`` as it comes; what is left after the last line is the answer."""
    pending = bytearray()
    for chunk in iter(lambda: connection.recv(1 << 16), b""):
        pending += chunk
        if on_event is not None and b"\n" in chunk:
            *lines, rest = bytes(pending).split(b"\n")
            pending = bytearray(rest)
            for line in lines:
                if line.strip():
                    on_event(json.loads(line))
    return bytes(pending)


def _connect(path: Path, silence: float) -> socket.socket | None:
    """A connection to the daemon at ``path``, or None where none listens (a socket file left
    by a daemon that died is removed); ``silence`` bounds the connection and each read after it."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(silence)
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


def _abandon(path: Path, inode: int | None) -> None:
    """Withdraw the socket (file ``inode``) of a daemon that went silent (hung, or stopped by a
    signal), so the next command starts a new one rather than waiting on it too; a newer daemon's
    socket at the same path is left alone."""
    with contextlib.suppress(OSError):
        if path.stat().st_ino == inode:
            path.unlink()


def _start(path: Path, silence: float) -> socket.socket:
    """Start a daemon for ``path`` (one at a time: two clients starting at once share it) and
    connect to it as soon as it listens."""
    import subprocess  # here, not at the top: a query to a running daemon never starts one

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection = _connect(path, silence)
        if connection is not None:  # another client started it meanwhile
            return connection
        log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the daemon
        command = [
            sys.executable,
            "-c",
            "from ragidx.cli import main; main()",
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
            connection = _connect(path, silence)
            if connection is not None:
                return connection
            time.sleep(0.02)
    ended = "exited at start" if child.poll() is not None else "did not start"
    raise DaemonUnavailable(f"the daemon {ended} (see {path.with_suffix('.log')})")
