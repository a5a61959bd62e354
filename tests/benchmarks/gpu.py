"""The CUDA path measured on a GPU: vectors against the CPU's, batch sizes, one-query latency, and
a random-weight model of Llama 3.1 8B's shape to run `ragidx bench` on (docs/gpu.md).

Usage:
  python -m tests.benchmarks.gpu facts
  python -m tests.benchmarks.gpu vectors --model smollm2 [--device cuda] [--dtype bfloat16]
  python -m tests.benchmarks.gpu random-model OUT_DIR --tokenizer-from FOLDER [--shape 8b|1b]
  python -m tests.benchmarks.gpu speed --model M --texts DIR [--strategies mean,aligned-wva]
      [--tokens 16384,65536,131072]
  python -m tests.benchmarks.gpu fallback --model M --texts DIR [--free-gib 14,16] [--chunks 256]

``vectors`` embeds the sample corpus (two chunks a document) and eight questions with every strategy
the model takes, in float32 on the CPU and in ``--dtype`` on ``--device``, and prints the cosines
between them and where each question's document ranks. ``speed`` times each strategy's build
at several batch sizes, then one-text readouts of a 16-word question eagerly and replayed from a
trace. ``fallback`` fills the card until ``--free-gib`` is left, as another program or a smaller card
would, loads ``--dtype auto`` (int8 where bf16 does not fit) and times it, then bf16 on the whole
card for comparison. ``--device cpu`` runs any but ``fallback`` without a GPU (to try the script).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from tests.support.real_models import PROBES, SAMPLE_CORPUS

CHUNKS_PER_DOCUMENT = 2
SHAPES = {  # Llama 3.1 8B and Llama 3.2 1B: layers, width, MLP, heads, key-value heads, tied head
    "8b": (32, 4096, 14336, 32, 8, False),
    "1b": (16, 2048, 8192, 32, 8, True),
}


def facts() -> dict[str, object]:
    """The GPU, torch and the host CPU's class (bf16 instructions or AVX2 only)."""
    import torch

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if "model name" in line), "")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else 0,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": model,
        "cpu_cores": len([line for line in flags.splitlines() if line.startswith("processor")]),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "avx2": " avx2" in flags,
    }


def corpus_chunks(runtime, chunk_tokens: int) -> tuple[list[str], list[list[tuple[int, int]]], list[str]]:
    """The first chunks of each sample document, their sentence spans, and their documents' names."""
    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.ingest.sources import SourceDocument, read_document, scan

    chunker = Chunker(runtime.tokenizer, chunk_tokens, 1, None)
    texts, sentences, owners = [], [], []
    for found in scan([SAMPLE_CORPUS], keep_text=False).documents:
        document = read_document(Path(found.path))
        if not isinstance(document, SourceDocument):
            continue
        for chunk in chunker.chunk(document.text)[:CHUNKS_PER_DOCUMENT]:
            texts.append(chunk.text)
            sentences.append([(start - chunk.start, end - chunk.start) for start, end in chunk.sentences])
            owners.append(Path(document.path).name)
    return texts, sentences, owners


def strategy_names(runtime) -> list[str]:
    from ragidx.indexer.strategies import REGISTRY

    if not runtime.arch.is_decoder:
        return ["mean"]
    return [*sorted(name for name, cls in REGISTRY.items() if cls.decoder_only), "mean"]


def probe_ranks(documents: np.ndarray, queries: np.ndarray, owners: list[str]) -> tuple[int, float]:
    """How many questions rank their document first, and the mean reciprocal rank."""
    ranks = []
    for probe, row in zip(PROBES, queries @ documents.T, strict=True):
        ranked = list(dict.fromkeys(owners[i] for i in np.argsort(-row, kind="stable")))
        ranks.append(ranked.index(PROBES[probe]) + 1)
    return sum(rank == 1 for rank in ranks), float(np.mean([1 / rank for rank in ranks]))


def vectors(model: str, device: str, dtype: str) -> list[dict[str, object]]:
    """Every strategy's vectors on ``device`` in ``dtype`` against float32 on the CPU."""
    import torch

    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    exact = load_runtime(model, "cpu", "float32")
    other = load_runtime(model, device, dtype)
    rows = []
    for name in strategy_names(exact):
        runs = {}
        for label, runtime in (("cpu float32", exact), (f"{device} {dtype}", other)):
            strategy = create_strategy(name, runtime)
            texts, sentences, owners = corpus_chunks(runtime, strategy.default_chunk_tokens)
            strategy.encode(texts[:2], "document")  # warm-up
            if runtime.device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            documents = strategy.encode(texts, "document", sentences=sentences)
            seconds = time.perf_counter() - started
            queries = strategy.encode(list(PROBES), "query")
            runs[label] = (documents, queries, seconds, probe_ranks(documents, queries, owners))
        (exact_docs, exact_queries, exact_seconds, exact_ranks), (docs, queries, seconds, ranks) = (
            runs.values()
        )
        cosines = np.concatenate([np.sum(docs * exact_docs, axis=1), np.sum(queries * exact_queries, axis=1)])
        row = {
            "strategy": name,
            "texts": len(cosines),
            "cosine_min": float(cosines.min()),
            "cosine_mean": float(cosines.mean()),
            "found_first_cpu": exact_ranks[0],
            "mrr_cpu": round(exact_ranks[1], 3),
            f"found_first_{device}": ranks[0],
            f"mrr_{device}": round(ranks[1], 3),
            "seconds_cpu": round(exact_seconds, 3),
            f"seconds_{device}": round(seconds, 3),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def random_model(out: Path, tokenizer_from: Path, shape: str) -> None:
    """A Llama of ``shape`` with random bf16 weights and SmolLM2's tokenizer, written as a model
    folder (its vectors mean nothing; its costs are real). Built on the GPU where there is one."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    layers, width, mlp, heads, kv_heads, tied = SHAPES[shape]
    source = json.loads((tokenizer_from / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=source["vocab_size"],
        hidden_size=width,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        bos_token_id=source.get("bos_token_id"),
        eos_token_id=source.get("eos_token_id"),
        pad_token_id=source.get("pad_token_id"),
    )
    started = time.perf_counter()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaModel(config).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="4GB")
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)  # its special tokens named
    parameters = sum(p.numel() for p in model.parameters())
    seconds = time.perf_counter() - started
    print(f"{shape}-shaped Llama, {parameters / 1e9:.2f}B weights, written in {seconds:.0f} s")


def batches(runtime, texts_dir: Path, strategy_name: str, token_budgets: list[int]) -> None:
    """Tokens/s of one strategy at each batch size: the device's default (from free memory), the
    CPU's 32 rows, then each budget of padded tokens (rows: a sixteenth of it)."""
    from ragidx.app.research.bench import bench_texts
    from ragidx.indexer.model.batch_size import ROW_TOKENS, BatchSettings

    chunks = bench_texts(runtime, texts_dir, 256, None)
    timed_build(runtime, chunks, strategy_name)  # the default
    for batch in [
        BatchSettings(),
        *(BatchSettings(max_rows=t // ROW_TOKENS, max_tokens=t) for t in token_budgets),
    ]:
        timed_build(runtime, chunks, strategy_name, batch)


def query(runtime, strategy_name: str, words: int, repeats: int = 20) -> None:
    """One-text readouts of ``words``-word questions: eager, then replayed from a trace (allowed
    here on any device, to measure it), their medians and whether the vectors are equal."""
    import torch

    from ragidx.indexer.strategies import create_strategy

    sentence = (
        "how does a heat pump move warmth from the cold air outside into a house in winter "
        "and what does it cost to run compared with a gas boiler over a year and a half"
    )
    words_in_order = sentence.split(" ")
    questions = [" ".join(words_in_order[i : i + words]) for i in range(repeats)]
    tokens = len(runtime.tokenize(questions[:1])[0])
    results = {}
    for mode in ("eager", "traced"):
        strategy = create_strategy(strategy_name, runtime)
        if mode == "traced" and strategy.one_row is not None:
            strategy.one_row.limit = None
        for question in questions[:3]:
            strategy.encode([question], "query")  # warm-up, and the trace recorded at the second
        times, found = [], []
        for question in questions:
            if runtime.device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            found.append(strategy.encode([question], "query")[0])
            times.append(1000 * (time.perf_counter() - started))
        traced = strategy.one_row is not None and strategy.one_row.trace is not None
        results[mode] = np.stack(found)
        print(
            f"{runtime.model_id} {strategy_name} {runtime.precision} on {runtime.device.type}, "
            f"{tokens}-token query, {mode}{' (trace replayed)' if traced else ''}: "
            f"p50 {statistics.median(times):.1f} ms, min {min(times):.1f} ms",
            flush=True,
        )
    cosines = np.sum(results["eager"] * results["traced"], axis=1)
    print(
        f"traced vs eager: equal {np.array_equal(results['eager'], results['traced'])}, "
        f"cosine min {cosines.min():.6f}",
        flush=True,
    )


def speed(model: str, texts_dir: Path, strategies: list[str], budgets: list[int], device: str) -> None:
    """:func:`batches` for each strategy, then :func:`query` for each, on one loaded model."""
    from ragidx.indexer.model.runtime import load_runtime

    started = time.perf_counter()
    runtime = load_runtime(model, device, "auto")
    print(f"{model} loaded on {device} in {runtime.precision} in {time.perf_counter() - started:.1f} s")
    for name in strategies:
        batches(runtime, texts_dir, name, budgets)
    for name in strategies:
        query(runtime, name, 16)


def timed_build(runtime, chunks: list[str], strategy_name: str, batch=None) -> tuple[np.ndarray, float]:
    """One strategy's vectors of ``chunks`` at ``batch`` (default: the device's, from free memory)
    and its tokens/s, printed with the batch it ended at and the GPU's peak allocation."""
    import torch

    from ragidx.indexer.strategies import create_strategy

    cuda = runtime.device.type == "cuda"
    strategy = create_strategy(strategy_name, runtime, **({"batch": batch} if batch else {}))
    strategy.encode(chunks[:64])
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    found = strategy.encode(chunks)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(len(ids) for ids in runtime.tokenize(chunks))
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    print(
        f"{runtime.model_id} {strategy_name} {runtime.precision}: rows<={strategy.batch.max_rows} "
        f"tokens<={strategy.batch.max_tokens}{'' if batch else ' (default)'}: {tokens / seconds:,.0f} "
        f"tokens/s ({len(chunks)} chunks, {tokens} tokens, {seconds:.2f} s), GPU peak {peak:.1f} GiB",
        flush=True,
    )
    return found, tokens / seconds


def fallback(model: str, texts_dir: Path, free_gibs: list[float], count: int) -> None:
    """``--dtype auto`` on a card with each of ``free_gibs`` free (the rest taken by a filler
    tensor): what it chose, its speed and memory; then bf16 on the whole card, and each run's
    vectors against it."""
    import gc

    import torch

    from ragidx.app.research.bench import bench_texts
    from ragidx.indexer.model.runtime import load_runtime

    runs = []
    for free_gib in free_gibs:
        taken = int(torch.cuda.mem_get_info()[0] - free_gib * 2**30)
        filler = torch.empty(taken, dtype=torch.uint8, device="cuda")
        started = time.perf_counter()
        runtime = load_runtime(model, "cuda", "auto")
        held = (torch.cuda.memory_allocated() - taken) / 2**30
        seconds = time.perf_counter() - started
        print(
            f"{free_gib:g} GiB free: auto chose {runtime.precision} in {seconds:.0f} s, holding {held:.1f}",
            flush=True,
        )
        chunks = bench_texts(runtime, texts_dir, 256, count)
        runs.append((free_gib, *timed_build(runtime, chunks, "mean")))
        query(runtime, "mean", 16, repeats=10)
        del runtime, filler
        gc.collect()
        torch.cuda.empty_cache()
    runtime = load_runtime(model, "cuda", "bfloat16")
    whole, whole_speed = timed_build(runtime, chunks, "mean")
    for free_gib, found, speed in runs:
        cosines = np.sum(found * whole, axis=1)
        print(
            f"{free_gib:g} GiB free against bf16 on the whole card: {speed / whole_speed:.2f}x the speed; "
            f"cosine min {cosines.min():.4f}, mean {cosines.mean():.4f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("facts")
    each = commands.add_parser("vectors")
    each.add_argument("--model", required=True)
    each.add_argument("--device", default="cuda")
    each.add_argument("--dtype", default="bfloat16")
    each = commands.add_parser("random-model")
    each.add_argument("out", type=Path)
    each.add_argument("--tokenizer-from", type=Path, required=True)
    each.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    each = commands.add_parser("speed")
    each.add_argument("--model", required=True)
    each.add_argument("--texts", type=Path, required=True)
    each.add_argument("--strategies", default="mean,aligned-wva")
    each.add_argument("--tokens", default="16384,65536,131072")
    each.add_argument("--device", default="cuda")
    each = commands.add_parser("fallback")
    each.add_argument("--model", required=True)
    each.add_argument("--texts", type=Path, required=True)
    each.add_argument("--free-gib", default="14", help="Comma-separated GiB to leave free, one run each.")
    each.add_argument("--chunks", type=int, default=256)
    args = parser.parse_args()
    if args.command == "facts":
        print(json.dumps(facts()))
    elif args.command == "vectors":
        vectors(args.model, args.device, args.dtype)
    elif args.command == "random-model":
        random_model(args.out, args.tokenizer_from, args.shape)
    elif args.command == "fallback":
        fallback(args.model, args.texts, [float(each) for each in args.free_gib.split(",")], args.chunks)
    else:
        budgets = [int(each) for each in args.tokens.split(",") if each]
        speed(args.model, args.texts, args.strategies.split(","), budgets, args.device)


if __name__ == "__main__":
    main()
