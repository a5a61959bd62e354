"""Which dtype ``--dtype auto`` runs on a CPU: measured once per machine and model shape, not assumed.

bfloat16 halves the bytes a matrix product moves, but only CPUs with bf16 dot-product
instructions (AVX512-BF16, AMX) turn that into speed: elsewhere oneDNN converts to float32 and
back, and bf16 runs at 0.4-0.7x float32 (docs/precision.md). So a CPU without those
instructions keeps float32, and one with them times a model-shaped matrix product in both dtypes
(about a second, cached per machine) and keeps bf16 only where it is clearly faster.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragidx.indexer.cache import cache_dir, read_json_cache, write_json_cache

PROBE_TOKENS = 256  # rows of the probe's product: a typical batch slice, large enough to be steady
PROBE_SECONDS = 0.4  # per dtype
BFLOAT16_SPEEDUP_NEEDED = 1.2  # below this, rounding is not worth the speed (and noise could flip it)
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
    dtype: Any, inputs: int, outputs: int, tokens: int = PROBE_TOKENS, seconds: float = PROBE_SECONDS
) -> float:
    """FLOP/s of a ``tokens x inputs -> outputs`` linear layer in ``dtype`` on the CPU."""
    import torch

    layer = torch.nn.Linear(inputs, outputs, bias=False).to(dtype).requires_grad_(False)
    batch = torch.randn(tokens, inputs, dtype=dtype)
    with torch.inference_mode():
        return best_flops_per_second(lambda: layer(batch), 2.0 * tokens * inputs * outputs, seconds)


def cpu_has_bfloat16_instructions() -> bool:
    """AVX512-BF16 or AMX, as torch detects them (without either, bf16 products are emulated)."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


@dataclass(frozen=True)
class PrecisionProbe:
    """One measurement: a model-shaped product's speed in both dtypes on this CPU, and the verdict."""

    float32_gflops: float
    bfloat16_gflops: float

    @property
    def chosen(self) -> str:
        faster = self.bfloat16_gflops >= BFLOAT16_SPEEDUP_NEEDED * self.float32_gflops
        return "bfloat16" if faster else "float32"


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
    """Time the model's widest product (hidden -> intermediate) in float32 and bfloat16, now."""
    import torch

    return PrecisionProbe(
        float32_gflops=linear_flops_per_second(torch.float32, hidden, intermediate) / 1e9,
        bfloat16_gflops=linear_flops_per_second(torch.bfloat16, hidden, intermediate) / 1e9,
    )


def cpu_auto_dtype(hidden: int, intermediate: int) -> str:
    """``float32`` or ``bfloat16``: what is measured faster for a model of this shape on this CPU."""
    if hidden < MIN_PROBED_HIDDEN or not cpu_has_bfloat16_instructions():
        return "float32"
    path = cache_dir() / CACHE_FILE
    key = _machine_key(hidden, intermediate)
    cached = read_json_cache(path)
    try:
        return PrecisionProbe(**cached[key]).chosen
    except (KeyError, TypeError):
        pass  # not measured yet for this machine and shape (or an entry from another version)
    probe = probe_precision(hidden, intermediate)
    write_json_cache(path, {**cached, key: asdict(probe)})
    return probe.chosen
