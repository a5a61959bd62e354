"""The command server beside the daemon: a repeated `ragidx query` runs there with the console
script's streams, folder, environment and exit status, the script importing neither click nor the
CLI; where it cannot, the script runs the command itself, with the same result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ragidx.app.daemon import address as daemon_address
from ragidx.app.daemon import launcher
from ragidx.app.daemon.command_server import CommandServer
from tests.support.cli import RAGIDX, assert_one_line_error, ragidx
from tests.support.daemon import alive

REPORT = "import atexit, json, sys; atexit.register(lambda: print(json.dumps([*sys.modules])))"
SCRIPT = f"{REPORT}; from ragidx.__main__ import main; main()"


def script(*args: str | Path, env: dict[str, str], **kwargs) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run the console script's code with ``args`` (the same interpreter as the daemon's, which
    is part of its fingerprint); its output and the modules its own process loaded."""
    run = [sys.executable, "-c", SCRIPT, *map(str, args)]
    result = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120, **kwargs)
    *output, modules = result.stdout.splitlines(keepends=True)
    return subprocess.CompletedProcess(run, result.returncode, "".join(output), result.stderr), set(
        json.loads(modules)
    )


def command_sockets(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["XDG_RUNTIME_DIR"]) / "ragidx").glob("*.cmd"))


def test_a_repeated_query_runs_in_the_command_server_as_it_would_here(daemon_env, small_index, tmp_path):
    query = ("query", "how long do refunds take", "-k", "3")
    first, started_with = script(*query, "--index", small_index, env=daemon_env)
    assert "ragidx.cli" in started_with  # no server yet: the script ran the CLI, which started one
    assert len(command_sockets(daemon_env)) == 1
    here = ragidx(*query, "--index", small_index, "--no-daemon").stdout
    again, loaded = script(*query, "--index", small_index, env=daemon_env)
    assert first.stdout == again.stdout == here and here.startswith(" 1  ")
    assert loaded.isdisjoint({"click", "ragidx.cli", "ragidx.app.catalog"}), sorted(loaded)
    # the folder and the environment are the script's: a relative --index, and $RAGIDX_INDEX
    relative, _ = script(
        *query, "--index", small_index.name, "--json", env=daemon_env, cwd=small_index.parent
    )
    from_env, _ = script(*query, "--json", env={**daemon_env, "RAGIDX_INDEX": str(small_index)}, cwd=tmp_path)
    expected = ragidx(*query, "--index", small_index, "--json", "--no-daemon").stdout
    assert relative.stdout == from_env.stdout == expected
    # so are its errors and exit statuses: one line and 1 for a refused query, usage and 2 for a slip
    missing, loaded = script("query", "refunds", "--index", tmp_path / "none", env=daemon_env)
    assert_one_line_error(missing, "no index at")
    assert missing.returncode == 1 and "ragidx.cli" not in loaded
    slip, _ = script("query", env=daemon_env)
    assert slip.returncode == 2 and "Missing argument 'TEXT'" in slip.stderr


def test_a_command_the_server_cannot_take_runs_here(daemon_env, small_index):
    query = ("query", "refunds", "--index", small_index, "-k", "2")
    ragidx(*query, env=daemon_env)  # starts the daemon and its command server
    # a closed standard input cannot be handed over: the script runs the command itself
    closed, loaded = script(*query, env=daemon_env, preexec_fn=lambda: os.close(0))
    assert "ragidx.cli" in loaded
    assert closed.stdout == ragidx(*query, "--no-daemon").stdout


def test_only_a_query_or_question_that_may_use_the_daemon_is_handed_over(monkeypatch):
    monkeypatch.setenv("RAGIDX_NO_DAEMON", "0")
    assert launcher.forwardable(["query", "refunds"]) and launcher.forwardable(["ask", "why?"])
    assert not launcher.forwardable(["query", "refunds", "--no-daemon"])
    assert not launcher.forwardable(["build", "docs"]) and not launcher.forwardable([])
    assert not launcher.forwardable(["--debug", "query", "refunds"])  # the CLI reads global options
    monkeypatch.setenv("RAGIDX_NO_DAEMON", "1")
    assert not launcher.forwardable(["query", "refunds"])


def test_the_command_server_ends_with_its_daemon(daemon_env, small_index):
    ragidx("query", "refunds", "--index", small_index, env=daemon_env)
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert [status["command_server"]["socket"]] == [str(path) for path in command_sockets(daemon_env)]
    assert ragidx("daemon", "stop", env=daemon_env).stdout.startswith("stopped daemon ")
    assert command_sockets(daemon_env) == []  # withdrawn before the stop was answered
    assert not alive(status["command_server"]["pid"])
    ragidx("query", "refunds", "--index", small_index, env={**daemon_env, "RAGIDX_DAEMON_IDLE": "1"})
    deadline = time.monotonic() + 30
    while command_sockets(daemon_env) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert command_sockets(daemon_env) == []  # and when the daemon leaves for idleness


def test_a_stop_request_and_the_daemons_exit_stop_the_server_once(monkeypatch):
    """The daemon's `stop` answer and its main loop's exit both stop the server, at once: its
    pipe end is closed once, and neither call fails (a second close was the CI failure
    `KeyError: 'pid'` in `ragidx daemon stop`). A slow close keeps the two calls overlapping."""
    path = Path(tempfile.mkdtemp(prefix="rgx-", dir="/tmp")) / "c.cmd"
    server = CommandServer.start(path, lambda argv: None)
    lifeline, closes = server.lifeline, []
    close = os.close

    def slow_close(descriptor: int) -> None:  # other threads' closes pass through untouched
        if descriptor == lifeline:
            closes.append(descriptor)
            time.sleep(0.2)
        close(descriptor)

    monkeypatch.setattr(os, "close", slow_close)
    failures: list[BaseException] = []

    def stop() -> None:
        try:
            server.stop()
        except BaseException as error:
            failures.append(error)

    both = [threading.Thread(target=stop) for _ in range(2)]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(10)
    monkeypatch.undo()
    assert failures == [] and len(closes) == 1
    assert not alive(server.pid) and not path.exists()


def children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def test_ctrl_c_on_the_script_interrupts_the_command_in_the_server(daemon_env, small_index):
    """The script's Ctrl-C closes its connection; the server interrupts the command's process as
    Ctrl-C would, which ends with Ctrl-C's status; the daemon answers on afterwards. The daemon
    is started as from a background job (SIGINT ignored, which it inherits); the script as from
    a terminal (SIGINT delivered)."""
    query = ("query", "refunds", "--index", small_index, "-k", "2")
    ignoring = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    expected = ragidx(*query, env=daemon_env, preexec_fn=ignoring).stdout  # starts the daemon and its server
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    server = status["command_server"]["pid"]
    os.kill(status["pid"], signal.SIGSTOP)  # the command waits for the daemon's answer
    try:
        client = subprocess.Popen(
            [RAGIDX, *map(str, query)],
            env=daemon_env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while not children(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        command = children(server)
        assert len(command) == 1  # the command runs in the server's child, waiting
        time.sleep(0.5)  # past the hand-over, into the wait
        client.send_signal(signal.SIGINT)
        _, stderr = client.communicate(timeout=30)  # the child holds the streams until it ends
        assert client.returncode == daemon_address.INTERRUPTED and "aborted" in stderr
        while children(server) and time.monotonic() < deadline:  # reaped by the server
            time.sleep(0.05)
        assert not alive(int(command[0])) and children(server) == []
    finally:
        os.kill(status["pid"], signal.SIGCONT)
    assert ragidx(*query, env=daemon_env).stdout == expected
