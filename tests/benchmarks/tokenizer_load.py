"""Time a model's tokenizer loads: AutoTokenizer, ragidx's first load (AutoTokenizer, then the
pipeline saved and checked) and its cached loads (the generic fast class), in one run, in an
empty tokenizer cache of its own.

    python -m tests.benchmarks.tokenizer_load [--model gemma3-270m]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any


def timed(label: str, load: Callable[[], Any]) -> None:
    started = time.perf_counter()
    tokenizer = load()
    print(f"{label:<34} {time.perf_counter() - started:6.2f} s  {type(tokenizer).__name__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    args = parser.parse_args()
    os.environ["RAGIDX_CACHE_DIR"] = tempfile.mkdtemp(prefix="ragidx-tokenizers-")
    from transformers import AutoTokenizer

    from ragidx.indexer.model.sources import resolve_model
    from ragidx.indexer.model.tokenizer_cache import load_tokenizer

    folder = resolve_model(args.model).loadable()  # converts a GGUF model first if it must
    AutoTokenizer.from_pretrained(folder)  # imports and file cache warm for every row
    timed("AutoTokenizer", lambda: AutoTokenizer.from_pretrained(folder))
    timed("ragidx, first load", lambda: load_tokenizer(folder))
    timed("ragidx, cached", lambda: load_tokenizer(folder))
    timed("AutoTokenizer again", lambda: AutoTokenizer.from_pretrained(folder))
    timed("ragidx, cached again", lambda: load_tokenizer(folder))


if __name__ == "__main__":
    main()
