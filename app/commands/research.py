"""The research commands: ``calibrate`` (kv-embedding's layers), ``eval`` (retrieval and STS
quality) and ``bench`` (speed). Their library code (:mod:`ragidx.app.research`) is imported when
one runs, so the everyday commands start without it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from ragidx.app import RagidxError
from ragidx.app.commands.options import (
    SweptStrategyOptionsCommand,
    comma_names,
    decoder_option,
    device_option,
    device_options,
    index_option,
    model_option,
    plot_option,
    pop_sweeps,
    report_json_option,
    swept_template_options,
    trust_remote_code_option,
)
from ragidx.app.commands.output import print_json, write_report_json


@click.command()
@decoder_option
@click.option(
    "--texts",
    type=click.Path(path_type=Path),
    default=None,
    help="A .txt (one text a line) or .jsonl file, or documents to split into sentences "
    "(default: ragidx's sample corpus).",
)
@click.option(
    "--n",
    "count",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Most texts (at least 20).",
)
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="Draw the curve to a PNG file.")
@device_options
@trust_remote_code_option
@click.option("--json", "as_json", is_flag=True, help="Print the curve and selection as JSON.")
def calibrate(
    model: str,
    texts: Path | None,
    count: int,
    plot: Path | None,
    device: str,
    dtype: str | None,
    trust_remote_code: bool,
    as_json: bool,
) -> None:
    """Pick kv-embedding's re-routing layers for MODEL by intrinsic dimension, and cache them."""
    from ragidx.app.research.calibrate import calibrate_model
    from ragidx.app.research.plots import plot_calibration

    calibration, path = calibrate_model(model, texts, count, device, dtype or "auto", trust_remote_code)
    if plot:
        plot_calibration(calibration, plot)
    if as_json:
        print_json({**asdict(calibration), "cache_path": str(path), "plot": str(plot) if plot else None})
        return
    click.echo(
        f"TwoNN intrinsic dimension of each layer's mean-pooled output "
        f"({calibration.text_count} texts from {calibration.texts_from})"
    )
    early = calibration.early_layers
    low, high = min(calibration.curve), max(calibration.curve)
    for layer, value in enumerate(calibration.curve):
        mark = (
            "selected"
            if layer in calibration.layers
            else "first 20%, not a candidate"
            if layer < early
            else ""
        )
        if layer == calibration.minimum_layer:
            mark += ", minimum"
        bar = "#" * (1 + round(29 * (value - low) / max(high - low, 1e-9)))
        click.echo(f"{layer:>5}  {value:7.2f}  {bar:<30}  {mark}")
    click.echo(f"re-routing layers {calibration.window} (minimum at layer {calibration.minimum_layer})")
    click.echo(f"cached for kv-embedding builds with this model: {path}")
    if plot:
        click.echo(f"plot: {plot}")


@click.group(name="eval")
def evaluate() -> None:
    """Measure retrieval (BEIR datasets) and similarity (STS) quality."""


@evaluate.command(name="retrieval", cls=SweptStrategyOptionsCommand)
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--split", default="test", show_default=True, help="qrels/<split>.tsv to score against.")
@click.option("--strategy", default=None, help="Comma-separated strategies (default: the model's default).")
@click.option(
    "--mode",
    "modes",
    default="dense,lexical,hybrid-equal,hybrid",
    show_default=True,
    help="Comma-separated: dense, lexical, hybrid (the index's tuned weights), hybrid-equal (plain RRF).",
)
@model_option
@click.option("--max-docs", type=click.IntRange(min=1), default=None, help="Subsample the corpus.")
@click.option("--max-queries", type=click.IntRange(min=1), default=None, help="Subsample the queries.")
@click.option(
    "--chunk-tokens", type=click.IntRange(min=8), default=None, help="Chunk budget (strategy default)."
)
@click.option("--max-length", type=click.IntRange(min=8), default=None, help="Longest input in tokens.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Rows per forward pass (default: the device's, as build's).",
)
@index_option
@device_options
@swept_template_options
@report_json_option
@plot_option
def eval_retrieval(
    directory: Path,
    split: str,
    strategy: str | None,
    modes: str,
    model: str,
    max_docs: int | None,
    max_queries: int | None,
    chunk_tokens: int | None,
    max_length: int | None,
    batch_size: int | None,
    index_dir: Path | None,
    device: str,
    dtype: str | None,
    json_target: str | None,
    plot: Path | None,
    **options: Any,
) -> None:
    """nDCG@10, Recall@10/100 and MRR@10 of each strategy and mode on a BEIR-layout DIRECTORY.

    Each strategy (and each combination of repeated strategy options) gets a temporary index of
    the corpus; with --index DIR the index there is reused if it exists, and otherwise built
    there and kept.
    """
    from ragidx.app.research.evaluation import (
        EVAL_MODES,
        evaluate_retrieval,
        expand_variants,
        load_beir,
        subsample,
    )
    from ragidx.app.research.plots import plot_retrieval

    mode_list = [mode for mode in comma_names(modes) if mode]
    unknown = sorted(set(mode_list) - set(EVAL_MODES))
    if unknown or not mode_list:
        raise RagidxError(
            f"unknown mode {', '.join(unknown) or modes!r}: choose from {', '.join(EVAL_MODES)}"
        )
    variants = expand_variants(comma_names(strategy), pop_sweeps(options))
    if index_dir and len(variants) > 1:
        raise RagidxError("--index holds one strategy's index: give one --strategy (and no sweep) with it")
    dataset = subsample(load_beir(directory, split), max_docs, max_queries)
    report = evaluate_retrieval(
        dataset,
        split,
        variants,
        mode_list,
        index_dir,
        model=model,
        device=device,
        dtype=dtype or "auto",
        chunk_tokens=chunk_tokens,
        max_length=max_length,
        batch_size=batch_size,
    )
    if plot:
        plot_retrieval(report, plot)
    if write_report_json(report, json_target):
        return
    click.echo(
        f"{report.dataset} ({report.split}): {report.queries} queries, {report.documents} documents, "
        f"model {report.model}"
    )
    width = max([14, *(len(row.label) + 2 for row in report.rows)])
    click.echo(
        f"{'strategy':<{width}}{'mode':<14}{'nDCG@10':>8}{'R@10':>8}{'R@100':>8}{'MRR@10':>8}"
        f"{'build s':>9}{'ms/query':>10}"
    )
    for row in report.rows:
        m = row.metrics
        click.echo(
            f"{row.label:<{width}}{row.mode:<14}{m['ndcg@10']:>8.4f}{m['recall@10']:>8.4f}"
            f"{m['recall@100']:>8.4f}{m['mrr@10']:>8.4f}{row.build_seconds:>9.1f}{row.query_ms:>10.1f}"
        )
    if "hybrid" in mode_list:
        for line in report.fusion_lines():
            click.echo(line)


@evaluate.command(name="sts", cls=SweptStrategyOptionsCommand)
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--strategy", default=None, help="Comma-separated strategies (default: the model's default).")
@model_option
@click.option("--max-pairs", type=click.IntRange(min=2), default=None, help="Use only the first N pairs.")
@device_options
@swept_template_options
@report_json_option
@plot_option
def eval_sts(
    path: Path,
    strategy: str | None,
    model: str,
    max_pairs: int | None,
    device: str,
    dtype: str | None,
    json_target: str | None,
    plot: Path | None,
    **options: Any,
) -> None:
    """Spearman x 100 between vector cosine and gold similarity on an STS-B or SICK file."""
    from ragidx.app.research.evaluation import evaluate_sts_variants, expand_variants, load_sts
    from ragidx.app.research.plots import plot_sts

    pairs = load_sts(path, max_pairs)
    variants = expand_variants(comma_names(strategy), pop_sweeps(options))
    report = evaluate_sts_variants(path, pairs, model, variants, device, dtype or "auto")
    if plot:
        plot_sts(report, plot)
    if write_report_json(report, json_target):
        return
    click.echo(f"{path.name}: {report.pairs} pairs, model {report.model}")
    width = max([14, *(len(row.label) + 2 for row in report.rows)])
    for row in report.rows:
        click.echo(f"{row.label:<{width}}Spearman x 100 = {row.spearman:6.2f}   ({row.seconds:.1f} s)")


@click.command()
@model_option
@click.option("--strategy", default=None, help="Comma-separated strategies (default: the model's default).")
@click.option(
    "--texts",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Documents to chunk and embed (default: ragidx's sample corpus).",
)
@click.option("--chunk-tokens", type=click.IntRange(min=8), default=256, show_default=True)
@click.option("--max-texts", type=click.IntRange(min=1), default=None, help="Use only the first N chunks.")
@click.option("--queries", type=click.IntRange(min=0), default=20, show_default=True, help="Timed queries.")
@device_option
@click.option(
    "--dtype",
    default="auto",
    show_default=True,
    help="Comma-separated precisions to compare in one run, e.g. float32,bfloat16.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def bench(
    model: str,
    strategy: str | None,
    texts: Path | None,
    chunk_tokens: int,
    max_texts: int | None,
    queries: int,
    device: str,
    dtype: str,
    as_json: bool,
) -> None:
    """Throughput, memory, query latency, layers run, FLOP/s against the matmul peaks, and the
    ratio to a hand-written transformers forward, per strategy and dtype."""
    from ragidx.app.research.bench import run_bench
    from ragidx.app.research.calibrate import SAMPLE_CORPUS

    report = run_bench(
        model,
        comma_names(strategy),
        [name for name in comma_names(dtype) if name] or ["auto"],
        device,
        texts or SAMPLE_CORPUS,
        chunk_tokens,
        max_texts,
        queries,
    )
    if as_json:
        print_json(report.to_dict())
        return
    peaks = ", ".join(f"{dtype} {flops / 1e9:.0f}" for dtype, flops in report.matmul_peaks.items())
    click.echo(
        f"{report.model} on {report.device}, {report.texts} chunks of <= {chunk_tokens} tokens; "
        f"{report.probe_size}^3 matmul GFLOP/s: {peaks}"
    )
    click.echo(
        f"{'strategy':<14}{'dtype':>9}{'tokens/s':>10}{'vectors/s':>11}{'peak MiB':>10}{'query p50':>11}"
        f"{'p95 ms':>8}{'layers':>8}{'GFLOP/s':>9}{'of peak':>9}{'of best':>9}{'x anchor':>10}"
    )
    for row in report.rows:
        click.echo(
            f"{row.strategy:<14}{row.dtype:>9}{row.tokens_per_second:>10.1f}{row.vectors_per_second:>11.2f}"
            f"{row.peak_rss_mib:>10.0f}{row.query_p50_ms:>11.1f}{row.query_p95_ms:>8.1f}"
            f"{row.fraction_of_layers:>8.2f}{row.flops_per_second / 1e9:>9.1f}{row.fraction_of_peak:>9.1%}"
            f"{row.fraction_of_best_peak:>9.1%}{row.ratio_to_anchor:>10.2f}"
        )
    for row in report.rows:
        device_memory = f", GPU peak {row.peak_device_mib:.0f} MiB" if row.peak_device_mib else ""
        click.echo(
            f"{row.strategy} ({row.dtype}): batches of <= {row.batch_rows} rows, {row.batch_tokens} "
            f"padded tokens; {row.padding:.1%} of cells padding{device_memory}"
        )
    anchors = {(row.dtype, row.anchor, round(row.anchor_tokens_per_second)) for row in report.rows}
    for row_dtype, name, rate in sorted(anchors):
        click.echo(f"anchor ({row_dtype}): {name}, {rate} tokens/s")


def register(group: click.Group) -> None:
    """Add the research commands to ``group`` (the ``ragidx`` command, in ragidx/cli.py)."""
    for command in (calibrate, evaluate, bench):
        group.add_command(command)
