"""Latency of OpenAI's embeddings route against ragidx's own, for one short text, warm.

    python -m tests.benchmarks.openai_latency [--model gemma3-270m | --index DIR] [--requests 50]
        [--import-from DIR]

Starts `ragidx serve --model M` (embeddings without an index; or `--index DIR`, which versions
before `--model` need) in its own process, warms the
routes, then alternates `GET /health`, `POST /embed` and `POST /v1/embeddings` (the openai
client's default base64 encoding) over one kept-alive connection, and prints each route's median
and the ratio of the two embedding routes. ``--import-from DIR`` serves with the ragidx in
``DIR/ragidx`` (a worktree of another commit; a route it lacks is left out).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

TEXT = "how do I return a bicycle"
WARM_UP = 5  # rounds not timed: the first ones settle the traced readout


def start(served: list[str], import_from: Path | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command, env = [str(Path(sys.executable).with_name("ragidx"))], dict(os.environ)
    if import_from is not None:
        command = [sys.executable, "-m", "ragidx"]
        env["PYTHONPATH"] = str(import_from)
    server = subprocess.Popen(
        [*command, "serve", *served, "--port", str(port)], stderr=subprocess.DEVNULL, env=env
    )
    return server, f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--index", type=Path, default=None, help="serve this index instead of --model")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--import-from", type=Path, default=None, help="serve DIR/ragidx instead")
    args = parser.parse_args()
    served = ["--index", str(args.index)] if args.index else ["--model", args.model]
    server, url = start(served, args.import_from)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            while True:
                try:
                    models = client.get("/v1/models")
                    break
                except httpx.TransportError:
                    if server.poll() is not None:
                        raise SystemExit(f"ragidx serve {' '.join(served)} exited") from None
                    time.sleep(0.2)
            routes: dict[str, dict[str, Any] | None] = {
                "/health": None,
                "/embed": {"texts": [TEXT], "role": "query"},
            }
            if models.status_code == 200:
                name = models.json()["data"][0]["id"]
                routes["/v1/embeddings"] = {"model": name, "input": [TEXT], "encoding_format": "base64"}
            times: dict[str, list[float]] = {route: [] for route in routes}
            for step in range(args.requests + WARM_UP):
                for route, body in routes.items():
                    started = time.perf_counter()
                    sent = client.get(route) if body is None else client.post(route, json=body)
                    sent.raise_for_status()
                    if step >= WARM_UP:
                        times[route].append((time.perf_counter() - started) * 1000)
    finally:
        server.terminate()
        server.wait()
    medians = {route: statistics.median(found) for route, found in times.items()}
    ratio = medians["/v1/embeddings"] / medians["/embed"] if "/v1/embeddings" in medians else None
    print(
        f"{args.index or args.model}, one text, {args.requests} each, alternating: "
        + ", ".join(f"{route} p50 {ms:.1f} ms" for route, ms in medians.items())
        + (f"; ratio {ratio:.3f}" if ratio else "")
    )


if __name__ == "__main__":
    main()
