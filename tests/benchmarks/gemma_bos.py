"""What Gemma 3 loses without its <bos>: STS-B dev Spearman x 100 per strategy, with the tokenizer
as converted, then with its post-processor (which adds <bos>) removed, as transformers 5.18-5.22
converted it (docs/gpu.md).

Usage: python -m tests.benchmarks.gemma_bos ../shared/eval/stsb/sts-dev.csv [--max-pairs 200]
       [--strategies kv-embedding,aligned-wva,mean,prompteol]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sts", type=Path)
    parser.add_argument("--max-pairs", type=int, default=200)
    parser.add_argument("--strategies", default="kv-embedding,aligned-wva,mean,prompteol")
    args = parser.parse_args()
    from tokenizers import processors

    from ragidx.app.research.evaluation import evaluate_sts, load_sts
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    pairs = load_sts(args.sts, args.max_pairs)
    runtime = load_runtime("gemma3-270m", "cpu", "float32")
    names = args.strategies.split(",")
    tokenizer = runtime.tokenizer
    with_bos = {name: evaluate_sts(pairs, create_strategy(name, runtime)) for name in names}
    first_tokens = tokenizer.convert_ids_to_tokens(tokenizer("The lighthouse")["input_ids"])
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    print(f"{len(pairs.gold)} pairs; 'The lighthouse' -> {first_tokens}, then without <bos>")
    for name in names:
        without = evaluate_sts(pairs, create_strategy(name, runtime))
        print(f"{name}: with <bos> {with_bos[name]:.2f}, without {without:.2f}", flush=True)


if __name__ == "__main__":
    main()
