"""Refuse a model that cannot fit, in one line and before anything is loaded or converted.

An 8B model in float32 needs ~32 GB; loading it on a 16 GB laptop swaps the machine to a halt or
gets the process killed minutes later. The weights' size is known from file headers alone (GGUF
tensor shapes, safetensors headers), so the check costs milliseconds. ``RAGIDX_MEMORY_CHECK=0``
turns it off for a machine whose swap or overcommit the estimate does not know about.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

from safetensors import safe_open

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.batch_size import GPU_MEMORY_SHARE, GPU_MIN_TOKENS, activation_bytes_per_token
from ragidx.indexer.model.half_weights import can_hold_half_weights
from ragidx.indexer.model.precision import cpu_has_bfloat16_instructions

# What a run holds per weight. int8: a byte, an eighth for each group's float16 scale and offset,
# and the embedding's share in 16 bits; that share is not known from a header, so all weights count
# 1.25 bytes (measured: a random 8B GGUF peaked at 9.1 GB against 9.0 counted, a 1B at 1.9 / 1.3).
# w8a8 loads through int8 weights (then a byte, a row's scale and sum): the same count.
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.25, "w8a8": 1.25}
LEANEST = "int8"  # what a run can hold a model in at the least
# int8 weights compute in float32, and w8a8's activations are float32 between its products
COMPUTE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 4, "w8a8": 4}
GPU_WORKSPACES = 512 * 2**20  # cuBLAS's and attention's workspaces, the caching allocator's rounding
CACHE_BYTES_PER_WEIGHT = 2  # a converted GGUF's weights are 16-bit
DISK_MARGIN = 1.05  # the converted copy: 16-bit weights, plus config, tokenizer and shard headers
# On a CPU, ``--dtype auto`` holds weights no larger than this share of the machine's memory, even
# where more would fit: a daemon holds them through its idle time, beside everything else the
# machine runs. It takes the leanest dtype that does (float16, then int8) where the measured one
# does not: a 1B model's float32 weights (4.3 GB) are over a sixth of a 16 GB laptop, its float16
# ones (2.1 GB) are not (docs/precision.md#how-auto-chooses).
HELD_SHARE = 1 / 6


def checking() -> bool:
    return os.environ.get("RAGIDX_MEMORY_CHECK", "1") not in ("0", "false", "False", "no")


def folder_parameters(folder: Path) -> int | None:
    """How many weights a model folder's safetensors hold, from their headers (None: no
    safetensors, e.g. a PyTorch ``.bin`` checkpoint, which is not checked)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    count = 0
    for file in files:
        with safe_open(str(file), framework="numpy") as weights:
            count += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118 - not a dict
    return count


def available_bytes(device: str) -> int:
    """Memory a model can take on ``device``: free GPU memory, else what the OS calls available."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    import psutil

    return int(psutil.virtual_memory().available)


def total_bytes() -> int:
    """The machine's physical memory (what :data:`HELD_SHARE` is a share of)."""
    import psutil

    return int(psutil.virtual_memory().total)


def weight_bytes(parameters: int, dtype: str) -> int:
    return int(parameters * BYTES_PER_WEIGHT[dtype])


def device_reserve(dtype: str, device: str, config: Any = None) -> int:
    """What a run needs on ``device`` beside its weights. On a GPU, room for the smallest batch
    (:data:`~ragidx.indexer.model.batch_size.GPU_MIN_TOKENS` in the share of free memory a batch
    takes) and the workspaces: on an H100 with 14 GiB free, an 8B model's 13.4 GiB of bf16 weights
    fitted and its first batch failed. On a CPU the OS's available memory already has slack."""
    if device != "cuda" or config is None:
        return 0
    batch = GPU_MIN_TOKENS * activation_bytes_per_token(config, COMPUTE_BYTES[dtype])
    return int(batch / GPU_MEMORY_SHARE) + GPU_WORKSPACES


def needed_bytes(parameters: int, dtype: str, device: str, config: Any = None) -> int:
    return weight_bytes(parameters, dtype) + device_reserve(dtype, device, config)


def leaner_dtypes(dtype: str, device: str) -> list[str]:
    """The dtypes that hold less memory than ``dtype`` and run at a usable speed on ``device``,
    leanest last. A CPU without bf16 instructions emulates bf16 products at about a hundredth of
    float32's speed (docs/precision.md), so there a model that does not fit in float32 goes to
    float16 or int8 weights (float32 products), not to bf16."""
    if device == "cpu":
        half = ("float16",) if can_hold_half_weights() else ()
        usable = (*half, "int8") if not cpu_has_bfloat16_instructions() else ("bfloat16", *half, "int8")
    else:
        usable = ("bfloat16", "int8")
    return [each for each in usable if BYTES_PER_WEIGHT[each] < BYTES_PER_WEIGHT[dtype]]


def auto_dtype(parameters: int, dtype: str, device: str, config: Any = None) -> tuple[str, str]:
    """What ``--dtype auto`` runs once memory has its say over the measured ``dtype``, and why it
    gave way ("" where it did not): on a CPU, float32 weights over :data:`HELD_SHARE` of the
    machine give way to the first leaner dtype within it (else the leanest); then, where that does
    not fit in the memory available, the first leaner one that does."""
    reason = ""
    share = HELD_SHARE * total_bytes()
    leaner = leaner_dtypes(dtype, device)
    if device == "cpu" and dtype == "float32" and leaner and weight_bytes(parameters, dtype) > share:
        within = [each for each in leaner if weight_bytes(parameters, each) <= share]
        reason = (
            f"{dtype} weights would take {_gb(weight_bytes(parameters, dtype))}, "
            f"over 1/{round(1 / HELD_SHARE)} of {_gb(total_bytes())}"
        )
        dtype = within[0] if within else leaner[-1]
    if not checking():
        return dtype, reason
    available = available_bytes(device)
    for each in [dtype, *leaner_dtypes(dtype, device)]:
        if needed_bytes(parameters, each, device, config) <= available:
            return each, reason if each == dtype else f"{dtype} would not fit in {_gb(available)} available"
    return dtype, reason


def check_fits(model: str, parameters: int, dtype: str, device: str, config: Any = None) -> None:
    """Refuse ``model`` if its weights in ``dtype``, and on a GPU the reserve beside them, exceed
    the memory ``device`` has available, naming the dtypes that would fit."""
    if not checking():
        return
    reserve = device_reserve(dtype, device, config)
    available = available_bytes(device)
    if weight_bytes(parameters, dtype) + reserve <= available:
        return
    sizes = {each: needed_bytes(parameters, each, device, config) for each in leaner_dtypes(dtype, device)}
    leaner = "".join(f" --dtype {each} ({_gb(size)})," for each, size in sizes.items() if size <= available)
    elsewhere = " --device cuda," if device != "cuda" else ""
    beside = f" (and {_gb(reserve)} for a batch)" if reserve else ""
    raise RagidxError(
        f"model '{model}' does not fit: {parameters / 1e9:.2f}B weights need "
        f"{_gb(weight_bytes(parameters, dtype))} in {dtype}{beside} and {device} has {_gb(available)} "
        f"available; use{leaner}{elsewhere} a smaller model file, or free memory (RAGIDX_MEMORY_CHECK=0 "
        "skips this check)"
    )


def disk_free(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def check_disk(model: str, parameters: int, folder: Path) -> None:
    """Refuse to start a conversion the cache's disk cannot hold (16-bit weights)."""
    needed = int(parameters * CACHE_BYTES_PER_WEIGHT * DISK_MARGIN)
    free = disk_free(folder)
    if needed > free:
        raise RagidxError(
            f"model '{model}' needs {_gb(needed)} of disk for its converted copy in {folder}, which has "
            f"{_gb(free)} free; free space there or set RAGIDX_CACHE_DIR to a larger disk"
        )


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"
