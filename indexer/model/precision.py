"""Which dtype ``--dtype auto`` runs on a CPU: measured once per machine and model shape, not assumed.

bfloat16 halves the bytes a matrix product moves, but only CPUs with bf16 dot-product
instructions (AVX512-BF16, AMX) turn that into speed: elsewhere oneDNN converts to float32 and
back, and bf16 runs at 0.4-0.7x float32 (docs/precision.md). So a CPU with those instructions
times a model-shaped matrix product in float32 and bf16 (about a second, cached per machine) and
keeps bf16 only where it is clearly faster. Elsewhere it runs float32 products, and times whether
oneDNN's packed float32 weights beat torch's product and whether float16 weights
(:mod:`ragidx.indexer.model.half_weights`: the GGUF cache's values exactly, half float32's memory,
widened inside fbgemm's kernel) keep up with them in a build: where they do they are taken, as a
query, which only streams weights, runs faster on half the bytes. int8 weights
(:mod:`ragidx.indexer.model.int8_weights`) are never chosen for speed: they compute in float32
after an upcast of every weight, so they are at best as fast in a build and 1.4-2.5x slower for a
query (measured on an AVX2-only CPU); memory alone picks them
(:func:`ragidx.indexer.model.memory.auto_dtype`). Where bf16 is not fast, int8 x int8 products
(:mod:`ragidx.indexer.model.int8_products`) are timed too, at a build's rows and a query's: they
pay on a 1B model's wide layers, not on a 135M one's, and are run only for the strategies
:mod:`ragidx.indexer.model.integer_admission` admits.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass, replace
from pathlib import Path
from typing import Any

from ragidx.indexer.cache import cache_dir, cache_lock, read_json_cache, write_json_cache
from ragidx.indexer.model.half_weights import can_hold_half_weights, hold_half
from ragidx.indexer.model.int8_products import can_multiply_integers, hold_integer
from ragidx.indexer.model.packed_linear import can_pack_linear_weights, pack_linear_weights

PROBE_TOKENS = 256  # rows of the probe's product: a typical batch slice, large enough to be steady
QUERY_TOKENS = 12  # rows of a query's products: integer products must not slow queries down
PROBE_SECONDS = 0.4  # per dtype
# How much faster than float32 bf16 must be to be chosen: below 1.2x, rounding is not worth the
# speed, and noise could flip the verdict.
BFLOAT16_SPEED_NEEDED = 1.2
# float16 weights are taken where a build runs at least this share of float32's speed: they halve
# the memory and speed up queries (1.3-5.7x at 12 rows of a 1B model's layers, AVX2), so a build a
# little slower is worth it, and noise around 1.0 must not flip the verdict from run to run.
HALF_SPEED_NEEDED = 0.9
# Integer products (W8A8) are taken, for the strategies they keep (integer_admission), where they run
# at least this much faster than the float product chosen at a build's rows, and no slower at a
# query's: they round every activation, so a gain within noise is not worth it. Their per-row
# rounding costs a few passes over each product's inputs and outputs, which a narrow model's short
# products do not earn back (SmolLM2's 576 -> 1536: 1.3x at 512 rows, 0.8x at 12; a 1B model's
# 2048 -> 8192: 1.5x and 1.6x; docs/integer-products.md).
INTEGER_SPEED_NEEDED = 1.2
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
    """FLOP/s of a ``tokens x inputs -> outputs`` linear layer in ``dtype`` on the CPU (``packed``:
    its weight reordered for oneDNN where this CPU can, as a loaded model's are; ``float16``: float16
    weights and float32 products, as a CPU run holds them; ``w8a8``: int8 x int8 products)."""
    import torch

    layer = torch.nn.Linear(inputs, outputs, bias=False).requires_grad_(False)
    if dtype == "float16":
        hold_half(layer)
    elif dtype == "w8a8":
        hold_integer(layer, layer.weight, None)
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
    oneDNN's packed one), with float16 weights, and on a CPU with bf16 instructions in bf16; and
    the verdicts."""

    float32_gflops: float
    packed_float32_gflops: float  # 0 where this CPU cannot pack float32 weights
    bfloat16_gflops: float  # 0 where this CPU lacks bf16 instructions: not timed, emulated there
    half_gflops: float  # float16 weights, float32 products; 0 where torch lacks fbgemm's product
    integer_gflops: float  # int8 x int8 products; 0 where not timed (bf16 instructions, or no fbgemm)
    integer_query_gflops: float  # the same at a query's rows (QUERY_TOKENS); 0 where not timed
    float_query_gflops: float  # the float product chosen, at a query's rows; 0 where not timed

    @property
    def packs_float32(self) -> bool:
        """Whether a float32 model's weights are packed here: wherever that is measured faster."""
        return self.packed_float32_gflops > self.float32_gflops

    @property
    def chosen(self) -> str:
        float32 = max(self.float32_gflops, self.packed_float32_gflops)
        if self.bfloat16_gflops >= BFLOAT16_SPEED_NEEDED * float32:
            return "bfloat16"
        return "float16" if self.half_gflops >= HALF_SPEED_NEEDED * float32 else "float32"

    @property
    def integer_speedup(self) -> float:
        """How much faster integer products ran than the float ones chosen at a build's rows; 0 where
        they were not timed or were slower at a query's rows."""
        chosen = {"bfloat16": self.bfloat16_gflops, "float16": self.half_gflops}.get(
            self.chosen, max(self.float32_gflops, self.packed_float32_gflops)
        )
        if not chosen or not self.float_query_gflops or self.integer_query_gflops < self.float_query_gflops:
            return 0.0
        return self.integer_gflops / chosen


def _machine_key(hidden: int, intermediate: int) -> str:
    """What the verdict depends on: the CPU, torch's kernels, the threads it may use, the shape."""
    import torch

    return "|".join(
        (
            _cpu_name(),
            torch.backends.cpu.get_cpu_capability(),
            f"torch {torch.__version__}",
            f"{torch.get_num_threads()} threads",
            f"{hidden}x{intermediate}",
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


def probe_precision(hidden: int, intermediate: int) -> PrecisionProbe:
    """Time the model's widest product (hidden -> intermediate) as a loaded model would run it:
    float32 plain and packed, float16 weights, and bf16 packed where this CPU has the instructions,
    else int8 x int8."""

    def gflops(dtype: str, packed: bool = False, tokens: int = PROBE_TOKENS) -> float:
        return linear_flops_per_second(dtype, hidden, intermediate, tokens, packed=packed) / 1e9

    bfloat16 = cpu_has_bfloat16_instructions()
    probe = PrecisionProbe(
        float32_gflops=gflops("float32"),
        packed_float32_gflops=gflops("float32", packed=True) if can_pack_linear_weights("float32") else 0.0,
        bfloat16_gflops=gflops("bfloat16", packed=True) if bfloat16 else 0.0,
        half_gflops=gflops("float16") if can_hold_half_weights() else 0.0,
        integer_gflops=0.0,
        integer_query_gflops=0.0,
        float_query_gflops=0.0,
    )
    if bfloat16 or not can_multiply_integers():
        return probe
    packed = probe.chosen == "float32" and probe.packs_float32
    return replace(
        probe,
        integer_gflops=gflops("w8a8"),
        integer_query_gflops=gflops("w8a8", tokens=QUERY_TOKENS),
        float_query_gflops=gflops(probe.chosen, packed, QUERY_TOKENS),
    )


def measured_precision(hidden: int, intermediate: int) -> PrecisionProbe | None:
    """This CPU's probe for a model of this shape, measured once and cached; None for a model too
    small to time (:data:`MIN_PROBED_HIDDEN`), which runs float32, unpacked. Processes that start
    at once measure one at a time: timed against each other, two once chose bf16 and float32."""
    if hidden < MIN_PROBED_HIDDEN:
        return None
    path = cache_dir() / CACHE_FILE
    key = _machine_key(hidden, intermediate)
    found = _cached_probe(path, key)
    if found is not None:
        return found
    with cache_lock(path):
        found = _cached_probe(path, key)  # measured by a process that held the lock first
        if found is not None:
            return found
        probe = probe_precision(hidden, intermediate)
        write_json_cache(path, {**read_json_cache(path), key: asdict(probe)})
    return probe


def _cached_probe(path: Path, key: str) -> PrecisionProbe | None:
    """The probe cached under ``key``; None where there is none, or one from another version or
    edited by hand into something that is not seven speeds (it is then measured again)."""
    try:
        probe = PrecisionProbe(**read_json_cache(path)[key])
    except (KeyError, TypeError):
        return None
    speeds = astuple(probe)
    if all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf for v in speeds):
        return probe
    return None


def cpu_auto_dtype(hidden: int, intermediate: int) -> str:
    """``float32``, ``float16`` (weights; float32 products) or ``bfloat16``: what is measured best
    for a model of this shape on this CPU (before memory has its say:
    :func:`ragidx.indexer.model.memory.auto_dtype`)."""
    probe = measured_precision(hidden, intermediate)
    return probe.chosen if probe else "float32"


def packs_float32(hidden: int, intermediate: int) -> bool:
    """Whether a float32 model of this shape gets oneDNN-packed weights on this CPU (measured)."""
    probe = measured_precision(hidden, intermediate)
    return probe is not None and probe.packs_float32


def integer_speedup(hidden: int, intermediate: int) -> float:
    """How much faster int8 x int8 products ran than the float ones ``auto`` chose, for a model of
    this shape on this CPU (measured; 0 where they were not timed)."""
    probe = measured_precision(hidden, intermediate)
    return probe.integer_speedup if probe else 0.0
