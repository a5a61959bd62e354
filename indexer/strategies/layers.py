"""Layer-set specifications shared by the strategies that read or rewire a range of layers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.paper_models import LayerTable, paper_layers

LAYERS_HELP = "Layer set, 0-based, e.g. 20-27 or 26,27,29."


def parse_layers(spec: str | Sequence[int], num_layers: int, option: str = "--layers") -> list[int]:
    """``"20-27"``, ``"26,27,29"`` or ``"1-3,7"`` (0-based, inclusive) to a sorted list of valid layers."""
    if isinstance(spec, str):
        layers: set[int] = set()
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            first, sep, last = part.partition("-")
            try:
                start, stop = int(first), int(last if sep else first)
            except ValueError:
                raise RagidxError(
                    f"{option} {spec!r}: use numbers and ranges like 20-27 or 26,27,29"
                ) from None
            if stop < start:
                raise RagidxError(f"{option} {spec!r}: range {part} runs backwards")
            layers.update(range(start, stop + 1))
    else:
        layers = {int(layer) for layer in spec}
    if not layers:
        raise RagidxError(f"{option} selects no layer")
    outside = sorted(layer for layer in layers if not 0 <= layer < num_layers)
    if outside:
        raise RagidxError(f"{option} names layers {outside} but the model has layers 0-{num_layers - 1}")
    return sorted(layers)


def relative_layers(num_layers: int, low: float, high: float) -> list[int]:
    """Every layer from round(low·L) to round(high·L), inclusive, kept inside the model."""
    first = min(round(low * num_layers), num_layers - 1)
    return list(range(first, min(round(high * num_layers), num_layers - 1) + 1))


def layer_set(
    given: str | Sequence[int] | None,
    config: Any,
    num_layers: int,
    papers: LayerTable,
    depth: tuple[float, float],
    calibrated: Callable[[], tuple[list[int], str] | None] = lambda: None,
    band: str = "relative depth {low:.2f}-{high:.2f}",
) -> tuple[list[int], str]:
    """The layers a strategy reads or rewires, and where they came from: ``--layers`` where given,
    else the paper's set for a model it names, else a cached calibration (where the strategy has
    one), else every layer in the relative ``depth`` band (said as ``band``)."""
    if given is not None:
        return parse_layers(given, num_layers), "--layers"
    chosen = paper_layers(config, papers) or calibrated()
    if chosen:
        return chosen
    low, high = depth
    return relative_layers(num_layers, low, high), band.format(low=low, high=high)


def parse_window(spec: str | Sequence[int], num_layers: int, option: str = "--rewire") -> tuple[int, int]:
    """``"1-7"`` to the half-open layer window [1, 7); ``"1-1"`` is an empty window."""
    try:
        if isinstance(spec, str):
            first, _, last = spec.partition("-")
            start, stop = int(first), int(last)
        else:
            start, stop = (int(value) for value in spec)
    except ValueError:
        raise RagidxError(f"{option} {spec!r}: use START-STOP, e.g. 1-7 (layers START to STOP-1)") from None
    if not 0 <= start <= stop <= num_layers:
        raise RagidxError(f"{option} {spec!r}: need 0 <= START <= STOP <= {num_layers} for this model")
    return start, stop


def resolve_layer(layer: int, num_layers: int, option: str) -> int:
    """A 0-based layer index; negative values count from the end as in Python (-2: second to last)."""
    resolved = layer + num_layers if layer < 0 else layer
    if not 0 <= resolved < num_layers:
        raise RagidxError(f"{option} {layer}: the model has layers 0-{num_layers - 1}")
    return resolved
