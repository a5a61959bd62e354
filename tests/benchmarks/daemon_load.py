"""The daemon and ``ragidx serve`` under load, as users meet them: each client a ``ragidx`` process.

Usage:
  python -m tests.benchmarks.daemon_load load --index IDX [--seconds 60] [--spinners 2]
      [--embedders 2] [--askers 2] [--queriers 4] [--texts 3000]
  python -m tests.benchmarks.daemon_load check --index IDX --dense-zero IDX0

``load``: for ``--seconds``, with ``--spinners`` processes spinning on the CPU, ``--embedders``
clients each embedding ``--texts`` texts through the daemon (``ragidx embed - --index IDX``),
``--askers`` streaming an answer from a loopback chat endpoint that never ends (``ragidx ask
--llm-url``), and ``--queriers`` querying in turn by keywords and hybrid. At the end the asks are
interrupted (SIGINT, as Ctrl-C) and the endpoint must see each request closed. Prints p50/p99 per
operation, errors, the daemons alive on the socket, the daemon's peak RSS and how long the
endpoint took to see each ask's request closed.

``check``: the acceptance checks of the scheduler's issue: (1) behind a 3,000-text embed and a
never-ending streamed ask, every keyword query within 2 s and hybrid within 3 s, the interrupted
ask's request closed within 5 s; (2) ``ragidx serve``: during a streamed ``POST /ask``,
``/health`` and ``GET /search`` within 1 s each, the endpoint's request closed within 5 s of the
client leaving; (3) with two spinning processes, 8 hybrid queries on ``--dense-zero`` (an index
whose tuned dense weight is 0) leave exactly one daemon, median within 1 s, none over 3 s.

Every daemon runs in a private folder of this run (``XDG_RUNTIME_DIR``) and is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

from tests.support.chat_server import FakeChat

RAGIDX = str(Path(sys.executable).with_name("ragidx"))  # the console script beside this Python
QUERIES = ["why are there two tides a day", "how do I reset my password", "heat pump", "sourdough starter"]


def fake_chat(mode: str) -> FakeChat:
    """tests/support/chat_server.py's misbehaving endpoint."""
    return FakeChat(mode, delay=0.05)


@contextlib.contextmanager
def spinning(count: int):
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@contextlib.contextmanager
def private_daemon():
    """An environment whose daemon lives in a folder of this run, stopped at the end."""
    folder = Path(tempfile.mkdtemp(prefix="rgx-", dir="/tmp"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(folder), "RAGIDX_NO_DAEMON": "0"}
    try:
        yield env
    finally:
        subprocess.run([RAGIDX, "daemon", "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def daemons(env: dict[str, str]) -> list[int]:
    """The daemon processes serving a socket of this run's folder: not the command server each
    forks beside it, nor that server's children, which carry the same command line."""
    found: dict[int, int] = {}  # pid: parent pid
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (proc / "cmdline").read_bytes().split(b"\0")
            if (
                b"daemon" in command
                and b"run" in command
                and any(env["XDG_RUNTIME_DIR"].encode() in c for c in command)
            ):
                parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
                found[int(proc.name)] = int(parent)
    return [pid for pid, parent in found.items() if parent not in found]


def interruptible() -> None:
    """In a child: SIGINT as a terminal's Ctrl-C delivers it (a benchmark run in the background,
    as by nohup or `&`, passes it on ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def daemon_pid(env: dict[str, str]) -> int:
    status = subprocess.run([RAGIDX, "daemon", "status", "--json"], env=env, capture_output=True, text=True)
    return int(json.loads(status.stdout)["pid"])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Record:
    """Latencies and errors per operation, from many threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, list[str]] = defaultdict(list)

    def timed(
        self, operation: str, command: list[str], env: dict[str, str], stdin: str | None = None
    ) -> None:
        started = time.perf_counter()
        done = subprocess.run(command, env=env, input=stdin, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        with self.lock:
            self.seconds[operation].append(seconds)
            if done.returncode != 0:
                self.errors[operation].append(
                    done.stderr.strip().splitlines()[-1:][0] if done.stderr else "?"
                )

    def table(self) -> str:
        rows = [
            "| operation | runs | p50 s | p99 s | max s | errors |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for operation, seconds in sorted(self.seconds.items()):
            ordered = sorted(seconds)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            errors = len(self.errors[operation])
            rows.append(
                f"| {operation} | {len(ordered)} | {statistics.median(ordered):.2f} | {p99:.2f} | "
                f"{ordered[-1]:.2f} | {errors} |"
            )
        return "\n".join(rows)


def load(args: argparse.Namespace, env: dict[str, str]) -> dict[str, object]:
    """One load run (see the module); returns its figures."""
    index = str(Path(args.index).resolve())
    record = Record()
    subprocess.run(
        [RAGIDX, "query", "warm", "--index", index], env=env, capture_output=True
    )  # the daemon runs
    pid = daemon_pid(env)
    stop = threading.Event()
    texts = "\n".join(
        f"line {n}: a sentence about tides, passwords and heat pumps" for n in range(args.texts)
    )

    def embedder() -> None:
        while not stop.is_set():
            record.timed("embed", [RAGIDX, "embed", "-", "--index", index, "--json"], env, texts)

    def querier(number: int) -> None:
        turn = 0
        while not stop.is_set():
            mode = ("lexical", "hybrid")[(number + turn) % 2]
            query = QUERIES[turn % len(QUERIES)]
            record.timed(
                mode, [RAGIDX, "query", query, "--index", index, "--mode", mode, "-k", "3", "--json"], env
            )
            turn += 1

    closings: list[float] = []
    with spinning(args.spinners), contextlib.ExitStack() as stack:
        fakes = [stack.enter_context(fake_chat("endless")) for _ in range(args.askers)]
        asks = [
            subprocess.Popen(
                [
                    RAGIDX,
                    "ask",
                    "what are tides",
                    "--index",
                    index,
                    "--llm-url",
                    fake.url,
                    "--max-new-tokens",
                    "4096",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=interruptible,
            )
            for fake in fakes
        ]
        threads = [threading.Thread(target=embedder) for _ in range(args.embedders)]
        threads += [threading.Thread(target=querier, args=(n,)) for n in range(args.queriers)]
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        alive_during = len(daemons(env))
        interrupted = time.monotonic()
        for ask in asks:
            ask.send_signal(signal.SIGINT)
        for fake in fakes:
            closings.append(
                fake.closed_at - interrupted if fake.closed.wait(30) and fake.closed_at else float("inf")
            )
        stop.set()
        for thread in threads:
            thread.join()
        for ask in asks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                ask.wait(30)
    return {
        "table": record.table(),
        "errors": {op: errors for op, errors in record.errors.items() if errors},
        "daemons_during": alive_during,
        "daemons_after": len(daemons(env)),
        "peak_rss_mb": round(peak_rss_mb(pid), 1),
        "endpoint_closed_after_s": [round(seconds, 2) for seconds in closings],
        "max": {op: round(max(seconds), 2) for op, seconds in record.seconds.items()},
    }


def check_serve(index: str) -> dict[str, object]:
    """Check (2): ragidx serve during a streamed /ask."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    with fake_chat("endless") as fake:
        server = subprocess.Popen(
            [RAGIDX, "serve", "--index", index, "--port", str(port), "--llm-url", fake.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=interruptible,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/health", timeout=5).status_code == 200:
                        break
                time.sleep(0.5)
            times: dict[str, float] = {}
            with (
                httpx.Client(timeout=60) as http,
                http.stream(
                    "POST", base + "/ask", json={"query": "what are tides", "k": 3, "max_new_tokens": 4096}
                ) as answer,
            ):
                lines = answer.iter_lines()
                for _ in range(5):
                    next(lines)
                for path in ("/health", "/search?q=tides&k=3"):
                    started = time.perf_counter()
                    http.get(base + path).raise_for_status()
                    times[path] = round(time.perf_counter() - started, 3)
            left = time.monotonic()
            closed = fake.closed_at - left if fake.closed.wait(30) and fake.closed_at else float("inf")
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(60)
    return {"seconds": times, "endpoint_closed_after_s": round(closed, 2)}


def check_dense_zero(index: str) -> dict[str, object]:
    """Check (3): 8 hybrid queries on a dense-0 index with two spinning processes."""
    with private_daemon() as env, spinning(2):
        seconds = []
        for number in range(8):
            started = time.perf_counter()
            done = subprocess.run(
                [RAGIDX, "query", QUERIES[number % len(QUERIES)], "--index", index, "-k", "3"],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            seconds.append(round(time.perf_counter() - started, 3))
            if done.returncode != 0:
                raise SystemExit(done.stderr)
        return {"seconds": seconds, "median": statistics.median(seconds), "daemons": len(daemons(env))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("load", "check"))
    parser.add_argument("--index", required=True)
    parser.add_argument("--dense-zero", default=None, help="check: an index whose tuned dense weight is 0")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--embedders", type=int, default=2)
    parser.add_argument("--askers", type=int, default=2)
    parser.add_argument("--queriers", type=int, default=4)
    parser.add_argument("--texts", type=int, default=3000)
    args = parser.parse_args()
    if args.what == "load":
        with private_daemon() as env:
            print(json.dumps(load(args, env), indent=1))
        return
    args.spinners, args.embedders, args.askers, args.queriers, args.seconds = (
        0,
        1,
        1,
        2,
        max(args.seconds, 30),
    )
    with private_daemon() as env:
        first = load(args, env)
    print(
        "(1) behind an embed and an endless ask:",
        json.dumps({k: v for k, v in first.items() if k != "table"}),
    )
    print(first["table"])
    print("(2) serve during a streamed ask:", json.dumps(check_serve(str(Path(args.index).resolve()))))
    if args.dense_zero:
        print(
            "(3) dense-0 index, two busy processes:",
            json.dumps(check_dense_zero(str(Path(args.dense_zero).resolve()))),
        )


if __name__ == "__main__":
    main()
