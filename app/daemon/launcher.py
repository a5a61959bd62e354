"""How the ``ragidx`` console script (``ragidx/__main__.py``) hands a query or a question to the
command server beside the daemon (:mod:`ragidx.app.daemon.command_server`) without importing the CLI;
anything else, or when no server answers, the script runs the CLI in its own process.

This module imports only what it takes to hand a command over (a socket, JSON and the daemon's
socket path, :mod:`ragidx.app.daemon.address`): with them Python starts in about a third of the
time it takes to import click and the CLI, which a query through the daemon used to pay on every
call. ``tests/test_startup.py`` holds it to that.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from ragidx.app.daemon import address as daemon_address

FORWARDED = ("query", "ask")  # the commands a daemon answers: the server's children ask it


def forwardable(argv: list[str]) -> bool:
    """Whether the command server may run ``argv``: a query or question that may use the daemon."""
    return (
        bool(argv)
        and argv[0] in FORWARDED
        and "--no-daemon" not in argv
        and daemon_address.wanted(no_daemon=False)
    )


def forwarded(argv: list[str]) -> int | None:
    """Hand ``argv`` with this process's standard streams, folder and environment to the running
    command server and return the command's exit status; None where no server took it (none
    runs, or it could not receive the command), so it runs here. A standard stream closed when
    this process started cannot be handed over (Python then sets it to None, and its number is
    free for the next file opened here: the socket to the server would go in its place)."""
    if None in (sys.stdin, sys.stdout, sys.stderr):
        return None
    try:
        path = daemon_address.command_socket_path(daemon_address.socket_path())
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    except (daemon_address.DaemonUnavailable, OSError):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        try:
            connection.connect(path)
            socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        except OSError:  # no server, or a standard stream closed
            return None
        try:
            reply = b"".join(iter(lambda: connection.recv(1 << 12), b""))
        except KeyboardInterrupt:  # leaving closes the connection, which interrupts the command
            return daemon_address.INTERRUPTED
        except OSError:
            reply = b""
    try:
        ended = json.loads(reply)
    except ValueError:
        print("error: the ragidx command server ended the command without its exit status", file=sys.stderr)
        return 1
    return ended.get("exit")  # else "unrun": the server could not take it
