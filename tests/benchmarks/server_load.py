"""Load check of `ragidx serve`: N concurrent POST /search requests over real HTTP; prints errors and latency.

    python -m tests.benchmarks.server_load --index DIR [--requests 200] [--queries queries.jsonl]
        [--import-from DIR]

The server is `ragidx serve` in its own process; every request is sent at once, each on its own
connection, so latency includes the wait for the model lock. Past the server's cap of 128
connections a request is answered 503 with Retry-After; the benchmark counts those first answers,
then retries each after the time the server asked for (as HTTP clients do), and reports what
everyone finally got. One request alone (sequential, warm) is timed first, as the floor.
``--import-from DIR`` serves with the ragidx found in ``DIR/ragidx`` (a worktree of another
commit), to compare two versions on the same index in one run.
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
        ragidx = [sys.executable, "-m", "ragidx"]
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


MAX_RETRIES = 20


async def fire(
    url: str, queries: list[str], n: int, k: int, mode: str
) -> list[tuple[float, int | str, int | str, int]]:
    """Each request's latency, first outcome, final outcome and retries (503s retried after the
    server's Retry-After)."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def one(i: int) -> tuple[float, int | str, int | str, int]:
            started = time.perf_counter()
            outcomes: list[int | str] = []
            while len(outcomes) <= MAX_RETRIES:
                try:
                    response = await client.post(
                        "/search", json={"query": queries[i % len(queries)], "k": k, "mode": mode}
                    )
                    outcomes.append(response.status_code)
                except httpx.HTTPError as error:
                    outcomes.append(type(error).__name__)
                    break
                if response.status_code != 503:
                    break
                await asyncio.sleep(float(response.headers.get("retry-after", 1)))
            return time.perf_counter() - started, outcomes[0], outcomes[-1], len(outcomes) - 1

        return await asyncio.gather(*(one(i) for i in range(n)))


def tally(outcomes: list[int | str]) -> str:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[str(outcome)] = counts.get(str(outcome), 0) + 1
    return ", ".join(f"{count} x {outcome}" for outcome, count in sorted(counts.items()))


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
    latencies = sorted(seconds * 1000 for seconds, *_ in results)
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    print(
        f"{args.requests} concurrent /search ({args.mode}, k={args.k}) on {info['model']} / "
        f"{info['strategy']} ({info['chunks']} chunks): first answers {tally([r[1] for r in results])}; "
        f"after {sum(r[3] for r in results)} retries {tally([r[2] for r in results])}; "
        f"p50 {statistics.median(latencies):.0f} ms, p95 {p95:.0f} ms, max {latencies[-1]:.0f} ms, "
        f"wall {wall:.1f} s, {args.requests / wall:.1f} req/s; "
        f"one request alone p50 {statistics.median(alone):.0f} ms"
    )


if __name__ == "__main__":
    main()
