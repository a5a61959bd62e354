"""Which dtype ``--dtype auto`` runs on a CPU: measured once per machine and model shape, not assumed.

bfloat16 halves the bytes a matrix product moves, but only CPUs with bf16 dot-product
instructions (AVX512-BF16, AMX) turn that into speed: elsewhere oneDNN converts to float32 and
back, and bf16 runs at 0.4-0.7x float32 (docs/precision.md). So a CPU with those instructions
times a model-shaped matrix product in float32 and bf16 (about a second, cached per machine) and
keeps bf16 only where it is clearly faster. A CPU without them times float32 against int8
weights with float32 products (:mod:`ragidx.indexer.model.int8_weights`: under a third of
the memory) and keeps int8 wherever it is within 5% of float32's speed.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragidx.indexer.cache import cache_dir, cache_lock, read_json_cache, write_json_cache
from ragidx.indexer.model.int8_weights import hold_int8
from ragidx.indexer.model.packed_linear import can_pack_linear_weights, pack_linear_weights

PROBE_TOKENS = 256  # rows of the probe's product: a typical batch slice, large enough to be steady
# int8 weights pay an upcast per product, which a build's batches (thousands of rows) amortise and a
# 256-row probe of one layer, whose float32 weights stay in cache, does not: at 256 rows SmolLM2's
# widest layer measured 0.93x float32 where the whole model's batches ran at 1.00x; so int8 is
# probed at a build batch's size.
INT8_PROBE_TOKENS = 2048
PROBE_SECONDS = 0.4  # per dtype
# The speed, relative to float32, a candidate needs to be chosen: bf16 must be clearly faster (below
# 1.2x, rounding is not worth the speed and noise could flip it); int8 weights hold under a third
# of the memory for the same float32 products, so they need only be about as fast.
SPEED_NEEDED = {"bfloat16": 1.2, "int8": 1 / 1.05}
# Below this width a product is so small (64 -> 128: ~2 MFLOP) that both dtypes run at the same
# per-call overhead (measured 0.98-1.01x here), so the probe would time noise: float32, unprobed.
MIN_PROBED_HIDDEN = 256
CACHE_FILE = "precision.json"


def best_flops_per_second(step: Callable[[], Any], flops: float, seconds: float) -> float:
    """The best FLOP/s of ``step`` over repeated calls for ``seconds``, after one warm-up call
    (oneDNN builds its kernel for a shape on the first call)."""
    step()
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        step()
        best = max(best, flops / (time.perf_counter() - started))
    return best


def linear_flops_per_second(
    dtype: str,
    inputs: int,
    outputs: int,
    tokens: int = PROBE_TOKENS,
    seconds: float = PROBE_SECONDS,
    packed: bool = False,
) -> float:
    """FLOP/s of a ``tokens x inputs -> outputs`` linear layer in ``dtype`` on the CPU (``int8``:
    int8 weights, float32 products, as a model in that dtype runs them; ``packed``: its weight
    reordered for oneDNN where this CPU can, as a loaded model's are)."""
    import torch

    layer = torch.nn.Linear(inputs, outputs, bias=False).requires_grad_(False)
    if dtype == "int8":
        hold_int8(layer)
    else:
        layer.to(getattr(torch, dtype))
        if packed:
            pack_linear_weights(layer)
    batch = torch.randn(tokens, inputs, dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    with torch.inference_mode():
        return best_flops_per_second(lambda: layer(batch), 2.0 * tokens * inputs * outputs, seconds)


def cpu_has_bfloat16_instructions() -> bool:
    """AVX512-BF16 or AMX, as torch detects them (without either, bf16 products are emulated)."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


@dataclass(frozen=True)
class PrecisionProbe:
    """One measurement: a model-shaped product's speed in float32 (torch's own product and
    oneDNN's packed one) and in the candidate dtype on this CPU, and the verdicts."""

    candidate: str
    float32_gflops: float
    packed_float32_gflops: float  # 0 where this CPU cannot pack float32 weights
    candidate_gflops: float

    @property
    def packs_float32(self) -> bool:
        """Whether a float32 model's weights are packed here: wherever that is measured faster."""
        return self.packed_float32_gflops > self.float32_gflops

    @property
    def chosen(self) -> str:
        float32 = max(self.float32_gflops, self.packed_float32_gflops)
        fast_enough = self.candidate_gflops >= SPEED_NEEDED[self.candidate] * float32
        return self.candidate if fast_enough else "float32"


def cpu_candidate() -> str:
    """The dtype worth timing against float32 on this CPU: bf16 where it has the instructions."""
    return "bfloat16" if cpu_has_bfloat16_instructions() else "int8"


def _machine_key(hidden: int, intermediate: int, candidate: str) -> str:
    """What the verdict depends on: the CPU, torch's kernels, the threads it may use, the shape."""
    import torch

    return "|".join(
        (
            _cpu_name(),
            torch.backends.cpu.get_cpu_capability(),
            f"torch {torch.__version__}",
            f"{torch.get_num_threads()} threads",
            f"{hidden}x{intermediate}",
            candidate,
        )
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_precision(hidden: int, intermediate: int, candidate: str) -> PrecisionProbe:
    """Time the model's widest product (hidden -> intermediate) as a loaded model would run it:
    float32 plain and packed, and ``candidate`` (bf16 packed where this CPU packs it), now."""
    tokens = INT8_PROBE_TOKENS if candidate == "int8" else PROBE_TOKENS

    def gflops(dtype: str, packed: bool = False) -> float:
        return linear_flops_per_second(dtype, hidden, intermediate, tokens, packed=packed) / 1e9

    return PrecisionProbe(
        candidate=candidate,
        float32_gflops=gflops("float32"),
        packed_float32_gflops=gflops("float32", packed=True) if can_pack_linear_weights("float32") else 0.0,
        candidate_gflops=gflops(candidate, packed=candidate == "bfloat16"),
    )


def measured_precision(hidden: int, intermediate: int) -> PrecisionProbe | None:
    """This CPU's probe for a model of this shape, measured once and cached; None for a model too
    small to time (:data:`MIN_PROBED_HIDDEN`), which runs float32, unpacked. Processes that start
    at once measure one at a time: timed against each other, two once chose bf16 and float32."""
    if hidden < MIN_PROBED_HIDDEN:
        return None
    candidate = cpu_candidate()
    path = cache_dir() / CACHE_FILE
    key = _machine_key(hidden, intermediate, candidate)
    found = _cached_probe(path, key)
    if found is not None:
        return found
    with cache_lock(path):
        found = _cached_probe(path, key)  # measured by a process that held the lock first
        if found is not None:
            return found
        probe = probe_precision(hidden, intermediate, candidate)
        write_json_cache(path, {**read_json_cache(path), key: asdict(probe)})
    return probe


def _cached_probe(path: Path, key: str) -> PrecisionProbe | None:
    """The probe cached under ``key``; None where there is none (or one from another version)."""
    try:
        return PrecisionProbe(**read_json_cache(path)[key])
    except (KeyError, TypeError):
        return None


def cpu_auto_dtype(hidden: int, intermediate: int) -> str:
    """``float32``, ``bfloat16`` or ``int8``: what is measured best for a model of this shape on
    this CPU (before memory has its say: :func:`ragidx.indexer.model.memory.fitting_dtype`)."""
    probe = measured_precision(hidden, intermediate)
    return probe.chosen if probe else "float32"


def packs_float32(hidden: int, intermediate: int) -> bool:
    """Whether a float32 model of this shape gets oneDNN-packed weights on this CPU (measured)."""
    probe = measured_precision(hidden, intermediate)
    return probe is not None and probe.packs_float32
