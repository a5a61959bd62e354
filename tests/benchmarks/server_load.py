"""Load check of `ragidx serve`: N concurrent POST /search requests over real HTTP; prints errors and latency.

    python tests/benchmarks/server_load.py --index DIR [--requests 200] [--queries queries.jsonl]
        [--import-from DIR]

The server is `ragidx serve` in its own process; every request is sent at once, so latency
includes the wait for the model lock. One request alone (sequential, warm) is timed first, as
the floor. ``--import-from DIR`` serves with the ragidx found in ``DIR/ragidx`` (a worktree of
another commit), to compare two versions on the same index in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

FALLBACK_QUERIES = [
    "how do I return a bicycle",
    "why are there two tides a day",
    "forgot my password",
    "espresso grind size",
    "what does the frame warranty cover",
    "compost heap smells",
    "rebase a branch onto main",
    "lighthouse lens",
]


def load_queries(path: Path | None) -> list[str]:
    if path is None:
        return FALLBACK_QUERIES
    return [
        json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def start_server(index: Path, device: str, import_from: Path | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ragidx = [str(Path(sys.executable).with_name("ragidx"))]  # the environment running this script
    env = dict(os.environ)
    if import_from is not None:
        ragidx = [sys.executable, "-c", "from ragidx.cli import main; main()"]
        env["PYTHONPATH"] = str(import_from)
    command = [*ragidx, "serve", "--index", str(index), "--port", str(port), "--device", device]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            httpx.get(url + "/health", timeout=2)
            return server, url
        except httpx.TransportError:
            time.sleep(0.2)


async def fire(url: str, queries: list[str], n: int, k: int, mode: str) -> list[tuple[float, int | str]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def one(i: int) -> tuple[float, int | str]:
            started = time.perf_counter()
            try:
                response = await client.post(
                    "/search", json={"query": queries[i % len(queries)], "k": k, "mode": mode}
                )
                outcome: int | str = response.status_code
            except httpx.HTTPError as error:
                outcome = type(error).__name__
            return time.perf_counter() - started, outcome

        return await asyncio.gather(*(one(i) for i in range(n)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--queries", type=Path, default=None, help="BEIR queries.jsonl (text field)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--mode", default="hybrid")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--import-from", type=Path, default=None, help="serve DIR/ragidx instead")
    args = parser.parse_args()

    server, url = start_server(args.index, args.device, args.import_from)
    try:
        info = httpx.get(url + "/info").json()
        queries = load_queries(args.queries)
        asyncio.run(fire(url, queries, 8, args.k, args.mode))  # warm-up
        alone = [
            asyncio.run(fire(url, [queries[i % len(queries)]], 1, args.k, args.mode))[0][0] * 1000
            for i in range(20)
        ]
        started = time.perf_counter()
        results = asyncio.run(fire(url, queries, args.requests, args.k, args.mode))
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait()
    latencies = sorted(seconds * 1000 for seconds, _ in results)
    errors = sorted({str(outcome) for _, outcome in results if outcome != 200})
    failed = sum(outcome != 200 for _, outcome in results)
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    print(
        f"{args.requests} concurrent /search ({args.mode}, k={args.k}) on {info['model']} / "
        f"{info['strategy']} ({info['chunks']} chunks): errors {failed} {errors}, "
        f"p50 {statistics.median(latencies):.0f} ms, p95 {p95:.0f} ms, max {latencies[-1]:.0f} ms, "
        f"wall {wall:.1f} s, {args.requests / wall:.1f} req/s; "
        f"one request alone p50 {statistics.median(alone):.0f} ms"
    )


if __name__ == "__main__":
    main()
