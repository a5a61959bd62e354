"""Is the last token of a bare sentence a summary of it at any layer? STS-B Spearman per layer.

Usage: python -m tests.benchmarks.last_token_layers --model smollm2 [--pairs 400] [--sink]

Reads the last real token's state after every decoder layer (and after the final norm, what
``--strategy last`` reads) for both sides of STS-B *train* pairs, and prints Spearman x 100 of
their cosines per layer. ``--sink`` puts the tokenizer's BOS token first where it adds none, to
separate "the wrong layer" and "no attention sink" from "the wrong position" as reasons for a weak
``last``. Compare with ``ragidx eval sts ... --strategy mean,last`` on the same pairs.
"""

from __future__ import annotations

import argparse

import numpy as np

from tests.support.real_models import EVAL_DATA


def keep_output(outputs: list) -> object:
    """A forward hook appending a decoder layer's hidden states (its first output) to ``outputs``."""
    return lambda _module, _args, out: outputs.append(out[0] if isinstance(out, tuple) else out)


def last_token_states(runtime, texts: list[str], sink: bool) -> np.ndarray:
    """[layers + 1, texts, hidden] unit vectors: each layer's output, then the final normed state."""
    import torch

    bos = runtime.tokenizer.bos_token_id
    ids = [runtime.tokenize([text])[0] for text in texts]
    if sink and bos is not None:
        ids = [row if row[:1] == [bos] else [bos, *row] for row in ids]
    layers = runtime.arch.layers
    states = np.zeros((len(layers) + 1, len(texts), runtime.arch.hidden_size), np.float32)
    for batch in runtime.batches(ids, 32, 8192):
        outputs: list[torch.Tensor] = []
        hooks = [layer.register_forward_hook(keep_output(outputs)) for layer in layers]
        try:
            final = runtime.forward(batch)
        finally:
            for hook in hooks:
                hook.remove()
        rows = torch.arange(len(batch.indices))
        for depth, output in enumerate([*outputs, final]):
            states[depth, batch.indices] = output[rows, batch.last_positions].float().numpy()
    return states / np.linalg.norm(states, axis=-1, keepdims=True)


def main() -> None:
    from ragidx.app.research.evaluation import load_sts
    from ragidx.app.research.metrics import spearman
    from ragidx.indexer.model.runtime import load_runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--sink", action="store_true", help="BOS first where the tokenizer adds none")
    args = parser.parse_args()
    pairs = load_sts(EVAL_DATA / "stsb" / "sts-train.csv", args.pairs)
    runtime = load_runtime(args.model, "cpu", args.dtype)
    first, second = (last_token_states(runtime, texts, args.sink) for texts in (pairs.first, pairs.second))
    cosines = np.sum(first * second, axis=-1)
    scores = [100 * spearman(row.tolist(), pairs.gold) for row in cosines]
    print(f"{args.model} ({args.dtype}), last token, {len(pairs.gold)} STS-B train pairs, sink {args.sink}")
    for depth, score in enumerate(scores):
        name = f"layer {depth}" if depth < len(scores) - 1 else "final norm"
        print(f"{name:>11}  {score:6.2f}")


if __name__ == "__main__":
    main()
