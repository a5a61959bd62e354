"""Where this user's daemon listens: its private folder and its socket's name.

The console script (:mod:`ragidx.app.daemon.launcher`) reads this on every ``ragidx query``, so it
imports only what Python has loaded at start-up anyway, with ``json`` and ``zlib``: ``pathlib``,
``typing`` and ``hashlib`` together cost a query ~12 ms here before it sends anything (a wheel
install, ``python -X importtime``). Paths are therefore plain strings.

The folder is ``$XDG_RUNTIME_DIR/ragidx``, else ``/tmp/ragidx-<uid>``, mode 0700, owned by the
user; the socket's name carries a fingerprint of the Python, the ragidx code and the environment
variables that change what a model computes, so a daemon started under other settings is never
asked.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import zlib

import ragidx

DISABLE_VARIABLE = "RAGIDX_NO_DAEMON"  # set (to anything but 0) to never use a daemon
IDLE_VARIABLE = "RAGIDX_DAEMON_IDLE"  # seconds a daemon waits for work before it exits
SILENCE_VARIABLE = "RAGIDX_DAEMON_SILENCE"  # seconds a client waits on a daemon that sends nothing
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (the shell's for SIGINT)
MAX_FOLDER_BYTES = 80  # leaves room for the socket's own name within AF_UNIX's 107 bytes
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
    """No daemon can be used here (the socket folder is not private, or one would not start), or
    the one asked stopped answering; ``partial``: after it had sent part of a streamed answer
    (which then must not be asked again here: it would be printed twice)."""

    def __init__(self, message: str, partial: bool = False):
        super().__init__(message)
        self.partial = partial


def wanted(no_daemon: bool) -> bool:
    """Whether a command should use the daemon: not when told otherwise by flag or environment."""
    return not no_daemon and os.environ.get(DISABLE_VARIABLE, "0") in ("", "0")


def runtime_folder() -> str:
    """The user's private folder for daemon sockets, made (0700) if missing; refused when another
    user owns it or others may enter it. ``/tmp/ragidx-<uid>`` where ``$XDG_RUNTIME_DIR`` is unset
    or too deep for a socket's name (at most 107 bytes on Linux)."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    fallback = f"/tmp/ragidx-{os.getuid()}"
    # A relative one is ignored, as the XDG specification says (it would follow the working folder).
    folder = os.path.join(base, "ragidx") if os.path.isabs(base) else fallback
    if len(os.fsencode(folder)) > MAX_FOLDER_BYTES:
        folder = fallback
    os.makedirs(folder, mode=0o700, exist_ok=True)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise DaemonUnavailable(f"{folder} is not a private folder of this user")
    return folder


def fingerprint() -> str:
    """What a daemon's answers depend on besides the request: this Python (its environment,
    ``sys.prefix``, and the interpreter it runs, links followed, so that ``python -m ragidx`` and
    the ``ragidx`` script, whose shebang names ``python3``, share one daemon), the ragidx code (its
    folder and the newest modification time of its files) and the environment that changes a
    model's output. A CRC-32 (``zlib``), not a cryptographic hash: it tells apart the few settings
    one user's daemons run under, and nobody gains by making two of them collide."""
    package = os.path.dirname(ragidx.__file__)
    folders = (package, os.path.join(package, "app"), os.path.join(package, "indexer"))
    newest = max((entry.stat().st_mtime_ns for folder in folders for entry in _py(folder)), default=0)
    settings = sorted(
        (key, value)
        for key, value in os.environ.items()
        if key.startswith(FINGERPRINTED_PREFIXES) and key not in UNFINGERPRINTED
    )
    python = [sys.prefix, os.path.realpath(sys.executable)]
    seen = json.dumps([ragidx.__version__, *python, package, newest, settings])
    return f"{zlib.crc32(seen.encode()):08x}"


def _py(folder: str) -> list[os.DirEntry[str]]:
    """The Python files under ``folder`` (recursively), as directory entries."""
    found: list[os.DirEntry[str]] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir() and not entry.name.startswith((".", "__")):
                    found += _py(entry.path)
                elif entry.name.endswith(".py"):
                    found.append(entry)
    except OSError:
        pass
    return found


def socket_path() -> str:
    return os.path.join(runtime_folder(), f"d-{fingerprint()}.sock")


def command_socket_path(daemon_socket: str) -> str:
    """Where the command server beside the daemon at ``daemon_socket`` listens
    (see :mod:`ragidx.app.daemon.command_server`)."""
    return os.path.splitext(daemon_socket)[0] + ".cmd"
