"""Layer selection by intrinsic dimension (KV-Embedding §3.2.3, methods.md §5), cached per model.

The TwoNN intrinsic dimension of every layer's mean-pooled output over ~1,000 texts traces a
curve through the network; KV-Embedding re-routes in the window that starts at its minimum.
The curve depends only on the model, so it is computed once (``ragidx calibrate``, whose text
gathering lives in ``app.research.calibrate``) and cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragidx.indexer.cache import cache_dir
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.pooling import masked_mean

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ragidx.indexer.model.runtime import ModelRuntime

DISCARD_FRACTION = 0.1  # Facco et al.: the largest 10% of the ratios are dropped from the fit
EARLY_FRACTION = 0.2  # layers below floor(0.2·L) only encode surface features (paper)
WINDOW_FRACTION = 0.1  # S = {l*, ..., min(L-1, l* + floor(0.1·L))}
MIN_TEXT_COUNT = 20
MAX_TEXT_TOKENS = 512
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".index.json")


def two_nn(points: np.ndarray, discard: float = DISCARD_FRACTION) -> float:
    """TwoNN intrinsic dimension (Facco et al. 2017) of a point cloud (one point per row).

    For each point μ = r2/r1, its second over first nearest-neighbour distance. Under local
    uniformity -log(1 - F(μ)) = d·log μ, so d is the slope of a line through the origin fitted
    to the empirical distribution, without the largest ``discard`` fraction of μ (the tail that
    density changes distort). Exact duplicates are dropped first: their r1 is zero.

    The fit rather than the shortcut N/Σlog μ over the kept ratios: truncating the tail biases
    that shortcut upward by about a third (the kept log-ratios are too small on average).
    """
    import numpy as np

    x = np.unique(np.asarray(points, dtype=np.float64), axis=0)
    if len(x) < 3:
        raise RagidxError("TwoNN needs at least 3 distinct points")
    squares = (x * x).sum(axis=1)
    distances = np.maximum(squares[:, None] + squares[None, :] - 2.0 * (x @ x.T), 0.0)
    np.fill_diagonal(distances, np.inf)
    nearest = np.partition(distances, 1, axis=1)[:, :2]
    nearest = nearest[nearest[:, 0] > 0]
    mu = np.sort(np.sqrt(nearest[:, 1] / nearest[:, 0]))
    kept = math.floor((1.0 - discard) * len(mu))
    log_mu = np.log(mu[:kept])
    log_survival = -np.log1p(-np.arange(1, kept + 1) / len(mu))
    return float((log_mu * log_survival).sum() / (log_mu * log_mu).sum())


def select_layers(curve: Sequence[float]) -> tuple[int, list[int]]:
    """The minimum l* of the curve outside the first floor(0.2·L) layers, and the window from it."""
    num_layers = len(curve)
    first = math.floor(EARLY_FRACTION * num_layers)
    candidates = [layer for layer in range(first, num_layers) if math.isfinite(curve[layer])]
    if not candidates:
        raise RagidxError("no layer has a finite intrinsic dimension; use more (and more varied) texts")
    best = min(candidates, key=lambda layer: curve[layer])
    last = min(num_layers - 1, best + math.floor(WINDOW_FRACTION * num_layers))
    return best, list(range(best, last + 1))


def layer_representations(
    runtime: ModelRuntime, texts: Sequence[str], progress: Callable[[int], None] | None = None
) -> np.ndarray:
    """[layers, texts, hidden] float32: each layer's output mean-pooled over the text's own tokens.

    Special tokens (BOS, CLS/SEP) are left out of the mean: their states are the same for every
    text and, as attention sinks, often huge, so they would swamp the distances TwoNN measures.
    """
    import numpy as np
    import torch

    specials = torch.tensor(sorted(set(runtime.tokenizer.all_special_ids)), dtype=torch.long)
    sequences = [ids[:MAX_TEXT_TOKENS] for ids in runtime.tokenize(texts)]
    out = np.zeros((runtime.arch.num_layers, len(texts), runtime.arch.hidden_size), dtype=np.float32)
    for batch in runtime.batches(sequences, max_rows=32, max_tokens=16384):
        own = batch.attention_mask * ~torch.isin(batch.input_ids, specials.to(batch.input_ids.device))

        def pool(states: torch.Tensor, own: torch.Tensor = own) -> torch.Tensor:
            return masked_mean(states, own)

        with contextlib.ExitStack() as stack:
            readings = [stack.enter_context(runtime.capture(layer, pool)) for layer in runtime.arch.layers]
            runtime.forward(batch, stop_after=runtime.arch.num_layers - 1)
        for layer, reading in enumerate(readings):
            out[layer, batch.indices] = reading[0].cpu().numpy()
        if progress:
            progress(len(batch.indices))
    return out


@dataclass(frozen=True)
class Calibration:
    """One model's intrinsic-dimension curve and the layer window chosen from it."""

    model: str
    model_key: str
    curve: list[float]
    minimum_layer: int
    layers: list[int]
    text_count: int
    texts_from: str
    created: float

    @property
    def early_layers(self) -> int:
        """How many first layers are never candidates (they encode surface features)."""
        return int(EARLY_FRACTION * len(self.curve))

    @property
    def window(self) -> str:
        """The selected layers as text: ``12-15``, or ``4`` for a single layer."""
        first, last = self.layers[0], self.layers[-1]
        return f"{first}" if first == last else f"{first}-{last}"

    def describe(self) -> str:
        return (
            f"calibration cache ({self.text_count} texts from {self.texts_from}, "
            f"TwoNN minimum at layer {self.minimum_layer})"
        )


def calibrate(
    runtime: ModelRuntime,
    texts: Sequence[str],
    texts_from: str,
    progress: Callable[[int], None] | None = None,
) -> Calibration:
    """Measure the curve over ``texts`` and select the re-routing window from it."""
    if len(texts) < MIN_TEXT_COUNT:
        raise RagidxError(
            f"calibration needs at least {MIN_TEXT_COUNT} distinct texts, got {len(texts)} from {texts_from}"
        )
    representations = layer_representations(runtime, texts, progress)
    curve = [two_nn(layer) for layer in representations]
    minimum, layers = select_layers(curve)
    return Calibration(
        model=runtime.model_id,
        model_key=model_key(runtime),
        curve=curve,
        minimum_layer=minimum,
        layers=layers,
        text_count=len(texts),
        texts_from=texts_from,
        created=time.time(),
    )


def _model_folder(runtime: ModelRuntime) -> Path | None:
    """Where the model's files are: its local folder, or its snapshot in the Hugging Face cache."""
    if runtime.folder:
        return Path(runtime.folder)
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(runtime.model_id, "config.json", revision=runtime.revision)
    return Path(config).parent if isinstance(config, str) else None


def _safetensors_header(path: Path) -> bytes:
    """The header of a safetensors file: names, dtypes, shapes and offsets of every tensor."""
    with path.open("rb") as file:
        size = int.from_bytes(file.read(8), "little")
        return file.read(min(size, 100_000_000))


def model_key(runtime: ModelRuntime) -> str:
    """``<model id>-<hash>``: the hash covers config.json and the weights' index (files, sizes, headers)."""
    digest = hashlib.sha256()
    folder = _model_folder(runtime)
    if folder is None:
        digest.update(runtime.model.config.to_json_string(use_diff=True).encode())
    else:
        digest.update((folder / "config.json").read_bytes())
        for path in sorted(p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)):
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
            if path.name.endswith(".safetensors"):
                digest.update(_safetensors_header(path))
            elif path.name.endswith(".index.json"):
                digest.update(path.read_bytes())
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", runtime.model_id).strip("_")[-60:]
    return f"{readable}-{digest.hexdigest()[:16]}"


def cache_path(key: str) -> Path:
    return cache_dir() / "calibration" / f"{key}.json"


def save_calibration(calibration: Calibration, path: Path) -> None:
    """Write atomically, so a concurrent build never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(asdict(calibration), indent=2), encoding="utf-8")
    partial.replace(path)


def calibrated_layers(runtime: ModelRuntime) -> tuple[list[int], str] | None:
    """The cached calibration's layers and what it was, or None where none is cached."""
    calibration = load_calibration(runtime)
    return (calibration.layers, calibration.describe()) if calibration else None


def load_calibration(runtime: ModelRuntime) -> Calibration | None:
    """The cached calibration of this exact model, or None (absent, unreadable, or for other layers)."""
    path = cache_path(model_key(runtime))
    try:
        calibration = Calibration(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    valid = all(0 <= layer < runtime.arch.num_layers for layer in calibration.layers)
    return calibration if valid and calibration.layers else None
