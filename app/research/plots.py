"""Charts for reports (matplotlib, from the optional ``plot`` extra), written straight to a file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragidx.app.research.metrics import RETRIEVAL_METRICS
from ragidx.indexer.errors import RagidxError

if TYPE_CHECKING:
    from ragidx.app.research.evaluation import RetrievalReport, StsReport
    from ragidx.indexer.strategies.layer_calibration import Calibration


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RagidxError("plots need matplotlib: pip install 'ragidx[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_calibration(calibration: Calibration, path: Path) -> None:
    """The intrinsic-dimension curve, the excluded early layers shaded and the chosen window marked."""
    plt = _pyplot()
    layers = range(len(calibration.curve))
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.plot(layers, calibration.curve, marker="o", color="tab:blue", label="TwoNN intrinsic dimension")
    excluded = calibration.early_layers
    if excluded:
        axes.axvspan(-0.5, excluded - 0.5, color="grey", alpha=0.15, label="first 20% (not candidates)")
    axes.axvspan(
        calibration.layers[0] - 0.5,
        calibration.layers[-1] + 0.5,
        color="tab:orange",
        alpha=0.25,
        label=f"re-routing layers {calibration.window}",
    )
    axes.set_xlabel("layer (output, mean-pooled)")
    axes.set_ylabel("intrinsic dimension")
    axes.set_title(f"{Path(calibration.model).name}: {calibration.text_count} texts", fontsize=10)
    axes.legend(fontsize=8)
    _save(figure, plt, path)


def _save(figure: Any, plt: Any, path: Path) -> None:
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise RagidxError(f"cannot write the plot to {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)


def plot_retrieval(report: RetrievalReport, path: Path) -> None:
    """One panel per metric, one bar per strategy and mode."""
    plt = _pyplot()
    labels = [f"{row.label or row.strategy}\n{row.mode}" for row in report.rows]
    figure, panels = plt.subplots(1, len(RETRIEVAL_METRICS), figsize=(3.2 * len(RETRIEVAL_METRICS), 3.6))
    for axes, metric in zip(panels, RETRIEVAL_METRICS, strict=True):
        values = [row.metrics[metric] for row in report.rows]
        bars = axes.bar(range(len(values)), values, color="tab:blue")
        axes.bar_label(bars, fmt="%.3f", fontsize=7)
        axes.set_xticks(range(len(values)), labels, fontsize=7, rotation=45, ha="right")
        axes.set_ylim(0, 1)
        axes.set_title(metric, fontsize=10)
    figure.suptitle(
        f"{report.dataset} ({report.split}): {report.queries} queries, {report.documents} documents, "
        f"{Path(report.model).name}",
        fontsize=10,
    )
    _save(figure, plt, path)


def plot_sts(report: StsReport, path: Path) -> None:
    """One bar per strategy and option combination (a sweep reads left to right in its order)."""
    plt = _pyplot()
    values = [row.spearman for row in report.rows]
    figure, axes = plt.subplots(figsize=(max(4.0, 0.7 * len(values) + 2), 3.8))
    bars = axes.bar(range(len(values)), values, color="tab:blue")
    axes.bar_label(bars, fmt="%.1f", fontsize=7)
    axes.set_xticks(
        range(len(values)), [row.label for row in report.rows], fontsize=7, rotation=45, ha="right"
    )
    axes.axhline(0, color="black", linewidth=0.6)
    axes.set_ylim(min(0.0, *values) - 5, 100)
    axes.set_ylabel("Spearman x 100")
    axes.set_title(f"{Path(report.file).name}: {report.pairs} pairs, {Path(report.model).name}", fontsize=10)
    _save(figure, plt, path)
