"""Talking to the per-user ragidx daemon (see :mod:`ragidx.app.daemon`), without loading anything.

A search tool runs many times a minute, and each ``ragidx query`` used to pay for importing
torch, loading a tokenizer and a model: seconds before the first result. The daemon keeps
indexes and their models loaded; the CLI sends it one JSON request over a Unix socket and prints
the answer. This module is what the CLI needs for that, and it imports nothing heavy: the socket
path, starting a daemon when none answers, one request and its reply.

The socket lives in a folder only the user can enter (``$XDG_RUNTIME_DIR/ragidx``, else
``/tmp/ragidx-<uid>``, mode 0700, owned by the user; the socket itself 0600), and its name
carries a fingerprint of the Python, the ragidx code and the environment variables that change
what a model computes, so a daemon started under other settings is never asked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ragidx
from ragidx.indexer.errors import RagidxError

DISABLE_VARIABLE = "RAGIDX_NO_DAEMON"  # set (to anything but 0) to never use a daemon
IDLE_VARIABLE = "RAGIDX_DAEMON_IDLE"  # seconds a daemon waits for work before it exits
SILENCE_VARIABLE = "RAGIDX_DAEMON_SILENCE"  # seconds a client waits on a daemon that sends nothing
DEFAULT_IDLE_SECONDS = 600
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (the shell's for SIGINT)
MAX_FOLDER_BYTES = 80  # leaves room for the socket's own name within AF_UNIX's 107 bytes
START_SECONDS = 60.0  # for a new daemon to listen (it binds before importing the model stack)
# A daemon silent this long (no answer, not even the pulse it sends while it works) is given up
# on, and the command answers in its own process: a daemon that hangs costs a query this much.
SILENCE_SECONDS = 15.0
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
FINGERPRINTED_PREFIXES = ("RAGIDX_", "HF_", "TRANSFORMERS_", "OMP_", "MKL_", "CUDA_", "TORCH_", "PYTORCH_")
UNFINGERPRINTED = {
    DISABLE_VARIABLE,
    IDLE_VARIABLE,
    SILENCE_VARIABLE,
    "RAGIDX_INDEX",
    "RAGIDX_MODEL",
    "RAGIDX_DEBUG",
}


class DaemonUnavailable(Exception):
    """No daemon can be used here (the socket folder is not private, or one would not start)."""


class NoDaemonRunning(DaemonUnavailable):
    """None listens (and none was to be started)."""


def wanted(no_daemon: bool) -> bool:
    """Whether a command should use the daemon: not when told otherwise by flag or environment."""
    return not no_daemon and os.environ.get(DISABLE_VARIABLE, "0") in ("", "0")


def runtime_folder() -> Path:
    """The user's private folder for daemon sockets, made (0700) if missing; refused when another
    user owns it or others may enter it. ``/tmp/ragidx-<uid>`` where ``$XDG_RUNTIME_DIR`` is unset
    or too deep for a socket's name (at most 107 bytes on Linux)."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    # A relative one is ignored, as the XDG specification says (it would follow the working folder).
    folder = Path(base) / "ragidx" if os.path.isabs(base) else Path(f"/tmp/ragidx-{os.getuid()}")
    if len(os.fsencode(folder)) > MAX_FOLDER_BYTES:
        folder = Path(f"/tmp/ragidx-{os.getuid()}")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise DaemonUnavailable(f"{folder} is not a private folder of this user")
    return folder


def fingerprint() -> str:
    """What a daemon's answers depend on besides the request: this Python, the ragidx code (the
    newest modification time of its files) and the environment that changes a model's output."""
    package = Path(ragidx.__file__).parent
    newest = max(
        (
            entry.stat().st_mtime_ns
            for folder in (package, package / "app", package / "indexer")
            for entry in _py(folder)
        ),
        default=0,
    )
    settings = sorted(
        (key, value)
        for key, value in os.environ.items()
        if key.startswith(FINGERPRINTED_PREFIXES) and key not in UNFINGERPRINTED
    )
    seen = json.dumps([ragidx.__version__, sys.executable, newest, settings])
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def _py(folder: Path) -> list[os.DirEntry[str]]:
    """The Python files under ``folder`` (recursively), as directory entries."""
    found: list[os.DirEntry[str]] = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith((".", "__")):
                found += _py(Path(entry.path))
            elif entry.name.endswith(".py"):
                found.append(entry)
    return found


def socket_path() -> Path:
    return runtime_folder() / f"d-{fingerprint()}.sock"


def command_socket_path(daemon_socket: Path) -> Path:
    """Where the command server beside the daemon at ``daemon_socket`` listens
    (see :mod:`ragidx.app.command_server`)."""
    return daemon_socket.with_suffix(".cmd")


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
    path = socket_path()
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
