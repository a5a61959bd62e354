"""Time and memory of `htp` against `mean` on one long document (the paper reports 1.1-1.2x).

Usage: python -m tests.benchmarks.htp [--shape 0.5b|tiny] [--tokens 4000] [--strategies htp,mean]
Each strategy runs in its own process: the model is loaded, a short text warms it up, then the
document is embedded --repeats times. Memory is sampled every 2 ms during embedding; "extra" is
the peak above the resident size just before, i.e. what the forward pass itself needs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragidx.app.research.bench import PeakRss
from tests.benchmarks.dtype import qwen2_05b_shaped
from tests.support.tiny_models import SAMPLE_CORPUS, save_tiny_model

MIB = 2**20


def long_document(tokenizer, tokens: int) -> str:
    """Whole sentences of the sample corpus (repeated if needed) up to about ``tokens`` tokens."""
    from ragidx.indexer.ingest.chunking import Chunker

    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(SAMPLE_CORPUS.rglob("*.*")))
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
        text = f"{text}\n\n{text}"
    return Chunker(tokenizer, chunk_tokens=tokens, overlap_sentences=0).chunk(text)[0].text


def child(model: str, name: str, tokens: int, repeats: int) -> dict:
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    runtime = load_runtime(model, device="cpu", dtype="float32")
    strategy = create_strategy(name, runtime, max_length=8192)
    document = long_document(runtime.tokenizer, tokens)
    strategy.encode(["A short warm-up text. It has two sentences."])
    seconds = []
    with PeakRss() as memory:
        for _ in range(repeats):
            started = time.perf_counter()
            strategy.encode([document])
            seconds.append(time.perf_counter() - started)
    return {
        "strategy": name,
        "input_tokens": len(strategy.prepare([document], "document", None)[0].ids),
        "seconds": statistics.median(seconds),
        "peak_mib": memory.peak / MIB,
        "extra_mib": (memory.peak - memory.before) / MIB,
        "layers_run": runtime.layers_run,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["0.5b", "tiny"], default="0.5b")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", default="htp,mean")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "STRATEGY"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.tokens, args.repeats)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = str(qwen2_05b_shaped(folder) if args.shape == "0.5b" else save_tiny_model("qwen2", folder))
        results = {}
        for name in args.strategies.split(","):
            command = [
                sys.executable,
                "-m",
                "tests.benchmarks.htp",
                "--tokens",
                str(args.tokens),
                "--repeats",
                str(args.repeats),
            ]
            out = subprocess.run(
                [*command, "--child", model, name], capture_output=True, text=True, check=True
            )
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"random Qwen2 ({args.shape} shape, float32, CPU), one document of ~{args.tokens} tokens")
    for row in results.values():
        print(
            f"{row['strategy']:>6}: {row['input_tokens']} input tokens, {row['seconds']:.2f} s, "
            f"peak RSS {row['peak_mib']:.0f} MiB (forward pass {row['extra_mib']:.0f} MiB)"
        )
    names = list(results)
    if len(names) == 2:
        a, b = results[names[0]], results[names[1]]
        print(
            f"{names[0]}/{names[1]}: time {a['seconds'] / b['seconds']:.2f}x, "
            f"peak RSS {a['peak_mib'] / b['peak_mib']:.2f}x, "
            f"forward-pass memory {a['extra_mib'] / max(b['extra_mib'], 1e-9):.2f}x"
        )


if __name__ == "__main__":
    main()
