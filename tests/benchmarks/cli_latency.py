"""What a person at the shell waits for: the default build, a refused build, and `ragidx query`
run again and again (the daemon's warm path), each as its own process, wall clock included.

Usage: python -m tests.benchmarks.cli_latency [--corpus sample_corpus] [--queries 20] [--model M]
       [--dtype D] [--skip-build] [--entry ragidx.app.daemon.launcher:main]

Runs ragidx with bytecode caching on, as installed from a wheel. Prints the default build's time
(`ragidx build CORPUS --rebuild`), a conflicting build's refusal (`--strategy htp` against the
index's default strategy), the first query after the build (which starts the daemon), and p50/p95
of the next queries in each mode. Each call runs the console script's entry point (``--entry``,
``ragidx.cli:main`` before the command server) as the `ragidx` script would, with the Python
that runs this file. Run it with another version's code first on PYTHONPATH (a git worktree) to
compare in one sitting; for the client's own start as users have it, with the Python of a venv
where ragidx is installed from its wheel (an editable install's finder adds ~9 ms to every start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRY = "ragidx.app.daemon.launcher:main"  # the console script's, pyproject.toml [project.scripts]
CORPUS = Path(__file__).resolve().parents[2] / "sample_corpus"
QUERIES = [
    "why are there two tides a day?",
    "how do I reset my password?",
    "how does a heat pump warm a house?",
    "what does a write-ahead log do?",
    "keeping a sourdough starter alive",
    "how long does shipping take?",
]


def script(entry: str) -> list[str]:
    """The command that runs ``entry`` (``module:function``) as a console script does: pip's and
    uv's script template imports ``re`` too (~4 ms here), which the script pays before ragidx."""
    module, function = entry.split(":")
    run = f"import re, sys; from {module} import {function}; sys.exit({function}())"
    return [sys.executable, "-c", run]


def timed(ragidx: list[str], *args: str, env: dict[str, str], check: bool = True) -> float:
    started = time.perf_counter()
    result = subprocess.run([*ragidx, *args], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if check and result.returncode != 0:
        raise SystemExit(f"ragidx {' '.join(args)} failed: {result.stderr[-800:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default=None, help="Passed to build and query (default: auto).")
    parser.add_argument("--index", type=Path, default=None, help="Reuse this index (default: a new one).")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--entry", default=ENTRY, help=f"The console script's entry point (default {ENTRY}).")
    arguments = parser.parse_args()
    ragidx = script(arguments.entry)
    with tempfile.TemporaryDirectory(prefix="rgx-") as scratch:
        index = str(arguments.index or Path(scratch) / "index")
        # a private daemon for this run: its socket lives under the scratch folder
        env = {**os.environ, "XDG_RUNTIME_DIR": scratch, "HF_HUB_OFFLINE": "1"}
        env.pop("RAGIDX_NO_DAEMON", None)
        # with bytecode caches, as a pip-installed package has them: without (this sandbox sets
        # PYTHONDONTWRITEBYTECODE), each start compiles the client's modules again, ~16 ms here
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        model = ["--model", arguments.model] if arguments.model else []
        precision = ["--dtype", arguments.dtype] if arguments.dtype else []
        if not arguments.skip_build:
            build = timed(
                ragidx,
                "build",
                str(arguments.corpus),
                "--index",
                index,
                "--rebuild",
                *model,
                *precision,
                env=env,
            )
            print(f"default build --rebuild: {build:.1f} s")
        refused = timed(
            ragidx,
            "build",
            str(arguments.corpus),
            "--index",
            index,
            "--strategy",
            "htp",
            env=env,
            check=False,
        )
        print(f"conflicting build refused in {refused:.2f} s")
        first = timed(ragidx, "query", QUERIES[0], "--index", index, *precision, env=env)
        print(f"first query (starts the daemon, loads the model): {first:.2f} s")
        time.sleep(5)  # the daemon settles its traced readout between queries, as a person pauses
        for mode in ("hybrid", "dense", "lexical"):
            seconds = [
                timed(
                    ragidx,
                    "query",
                    QUERIES[i % len(QUERIES)],
                    "--index",
                    index,
                    "--mode",
                    mode,
                    *precision,
                    env=env,
                )
                for i in range(arguments.queries)
            ]
            p95 = statistics.quantiles(seconds, n=20)[-1]
            print(f"query --mode {mode:7s}: p50 {statistics.median(seconds):.3f} s, p95 {p95:.3f} s")
        timed(ragidx, "daemon", "stop", env=env, check=False)


if __name__ == "__main__":
    main()
