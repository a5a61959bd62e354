"""The command server beside the daemon: a repeated ``ragidx query`` runs in a process that has
the CLI imported already.

Through the daemon, a query's own process does little: it parses, sends one request and prints.
Yet it paid for starting Python and importing click and the CLI, more than half of its wall
clock on a 2-core CPU. The daemon therefore forks this server when it starts (single-threaded,
before it imports the model stack), and the console script (:mod:`ragidx.app.daemon.launcher`) hands it
``query`` and ``ask``: the script's file descriptors 0-2 over the Unix socket (``SCM_RIGHTS``),
with its arguments, working folder and environment. The server forks a child per command, which
takes those as its own and runs the CLI's ``main`` on them, so the terminal, pipes, colour,
relative paths and exit status are the script's; the child asks the daemon like any CLI process,
then sends back its exit status. Mercurial's ``chg`` works the same way.

The server ends with the daemon: it watches a pipe whose other end only the daemon holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ragidx.app.daemon import address as daemon_address
from ragidx.app.daemon import client as daemon_client

REQUEST_SECONDS = 5.0  # for a client to send its whole command once connected
STOP_SECONDS = 2.0  # a stopping daemon waits this long for the server to withdraw its socket
STREAMS = 3  # stdin, stdout, stderr

Main = Callable[[list[str]], None]  # the CLI's main: exits (SystemExit) with the command's status


class CommandServer:
    """A forked command server (its pid and socket) and the pipe end that keeps it alive."""

    def __init__(self, pid: int, path: Path, lifeline: int):
        self.pid = pid
        self.path = path
        self.lifeline = lifeline
        self.stopping = threading.Lock()  # a `stop` request and the daemon's exit both stop it

    @classmethod
    def start(cls, path: Path, main: Main) -> CommandServer:
        """Fork a server that runs ``main`` for the commands sent to ``path``. Call it while this
        process has one thread (a fork copies only the caller's) and before torch or numpy start
        their thread pools."""
        listener = daemon_client.listen(path)
        lifeline_read, lifeline = os.pipe()  # neither end passes to a subprocess (non-inheritable)
        pid = os.fork()
        if pid == 0:
            os.close(lifeline)
            try:
                _serve(listener, path, lifeline_read, main)
            finally:
                os._exit(0)
        os.close(lifeline_read)
        listener.close()
        return cls(pid, path, lifeline)

    def stop(self) -> None:
        """Tell the server to withdraw its socket and exit, and wait (briefly) until it has. Safe
        from two threads at once: the pipe end is closed once (a second close could hit a file
        descriptor reused meanwhile, or fail and turn the daemon's answer to ``stop`` into an error)."""
        with self.stopping:
            if self.lifeline < 0:
                return
            os.close(self.lifeline)
            self.lifeline = -1
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return
            time.sleep(0.01)


def _serve(listener: socket.socket, path: Path, lifeline: int, main: Main) -> None:
    """Fork a child per connection until the daemon's end of ``lifeline`` closes; then withdraw
    the socket (unless a newer server's has replaced it). A stalled client holds up only its child."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are reaped by the kernel
    inode = path.stat().st_ino
    try:
        while lifeline not in select.select([listener.fileno(), lifeline], [], [])[0]:
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            with connection, contextlib.suppress(OSError):
                if os.fork() == 0:
                    try:
                        listener.close()
                        os.close(lifeline)
                        _run(connection, main)
                    finally:  # whatever happens, a child never returns into this loop
                        os._exit(1)
    finally:
        with contextlib.suppress(OSError):
            if path.stat().st_ino == inode:
                path.unlink()


def _run(connection: socket.socket, main: Main) -> NoReturn:
    """The child: become the client's process, run its command, send back the exit status. A
    request that never became a command is answered ``{"unrun": why}``: the client runs it itself."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a command's own subprocesses are waited for
    # Interruptible by _interrupt_when_gone even where SIGINT came ignored: a daemon started by a
    # command run in the background (`&`, nohup, a service) inherits that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        request = _become_client(connection)
    except (OSError, ValueError, KeyError, TypeError) as error:
        _end(connection, {"unrun": f"{type(error).__name__}: {error}"})
    connection.settimeout(None)
    threading.Thread(target=_interrupt_when_gone, args=(connection,), daemon=True).start()
    status = 1  # should the command die of what main does not catch
    try:
        status = _status_of(main, request["argv"])
    finally:
        _end(connection, {"exit": status})


def _end(connection: socket.socket, reply: dict[str, Any]) -> NoReturn:
    """Flush what the command printed, send ``reply`` and exit with its status."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(reply).encode() + b"\n")
    os._exit(reply.get("exit", 1))


def _become_client(connection: socket.socket) -> dict[str, Any]:
    """Receive the client's standard streams, arguments, folder and environment, and take them
    as this process's own; :class:`ValueError` for a request that is not whole or not JSON."""
    connection.settimeout(REQUEST_SECONDS)
    received, streams, _, _ = socket.recv_fds(connection, 1 << 16, STREAMS)
    data = bytearray(received)
    while not data.endswith(b"\n"):
        chunk = connection.recv(1 << 16)
        if not chunk:
            raise ValueError("a command ended before its request did")
        data += chunk
    if len(streams) != STREAMS:
        raise ValueError("a command came without its standard streams")
    request = json.loads(data)
    for target, stream in enumerate(streams):
        os.dup2(stream, target)
        os.close(stream)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    return request


def _status_of(main: Main, argv: list[str]) -> int:
    """The exit status ``main`` ends ``argv`` with (it ends every command with SystemExit)."""
    try:
        main(argv)
    except SystemExit as ended:
        code = ended.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return daemon_address.INTERRUPTED
    return 0


def _interrupt_when_gone(connection: socket.socket) -> None:
    """Interrupt the command (as Ctrl-C would) once its client has gone: it was stopped, and
    nobody waits for the rest of an answer."""
    with contextlib.suppress(OSError):
        while connection.recv(1 << 10):
            pass
    os.kill(os.getpid(), signal.SIGINT)
