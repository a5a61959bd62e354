"""A model's first use: `ragidx embed` in an empty cache (the GGUF conversion included), then again
with the conversion cached. Prints wall time and peak RSS of each, and the cache's size on disk.

Usage: python -m tests.benchmarks.first_run --model FILE_OR_NAME [--strategy mean] [--dtype auto]
       [--ragidx PATH]

Each run is its own process; its peak RSS comes from the kernel (``wait4``'s ru_maxrss), so the
figures include everything the process touched, the memory-mapped GGUF file's pages too.
``--ragidx`` runs another installation's console script (an older version, to compare).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAGIDX = str(Path(sys.executable).with_name("ragidx"))
TEXT = "A lighthouse keeper counts the ships that pass in the night."


def measured(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds and peak RSS (GB) of one run of ``command``."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed: {process.stderr.read().decode()[-800:]}")
    return seconds, usage.ru_maxrss * 1024 / 1e9


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--strategy", default="mean")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--ragidx", default=RAGIDX)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragidx-first-run-") as cache:
        env = {**os.environ, "RAGIDX_CACHE_DIR": cache, "RAGIDX_NO_DAEMON": "1", "HF_HUB_OFFLINE": "1"}
        command = [arguments.ragidx, "embed", "--model", arguments.model, "--strategy", arguments.strategy,
                   "--dtype", arguments.dtype, "--json", TEXT]  # fmt: skip
        first = measured(command, env)
        size = folder_bytes(Path(cache) / "models")
        again = measured(command, env)
    print(f"model {arguments.model}, strategy {arguments.strategy}, dtype {arguments.dtype}")
    print(f"first run (converting): {first[0]:6.1f} s, peak RSS {first[1]:.2f} GB; cache {size / 1e9:.2f} GB")
    print(f"second run (cached):    {again[0]:6.1f} s, peak RSS {again[1]:.2f} GB")


if __name__ == "__main__":
    main()
