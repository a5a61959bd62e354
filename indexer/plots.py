"""Charts for reports (matplotlib, from the optional ``plot`` extra), written straight to a file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragidx.indexer.errors import RagidxError

if TYPE_CHECKING:
    from ragidx.indexer.calibration import Calibration


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
    from ragidx.indexer.calibration import EARLY_FRACTION

    plt = _pyplot()
    layers = range(len(calibration.curve))
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.plot(layers, calibration.curve, marker="o", color="tab:blue", label="TwoNN intrinsic dimension")
    excluded = int(EARLY_FRACTION * len(calibration.curve))
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
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise RagidxError(f"cannot write the plot to {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)
