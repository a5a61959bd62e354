"""Layer-set specifications shared by the strategies that read or rewire a range of layers."""

from __future__ import annotations

from collections.abc import Sequence

from ragidx.indexer.errors import RagidxError


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
