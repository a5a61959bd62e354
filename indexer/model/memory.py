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

from safetensors import safe_open

from ragidx.indexer.errors import RagidxError

BYTES_PER_WEIGHT = {"float32": 4, "bfloat16": 2, "float16": 2}
SMALLEST_RUN = 2  # bytes per weight of the leanest dtype a run can choose (bf16 or f16)
DISK_MARGIN = 1.05  # the converted copy: 16-bit weights, plus config, tokenizer and shard headers


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


def check_fits(model: str, parameters: int, dtype: str, device: str) -> None:
    """Refuse ``model`` if its weights in ``dtype`` exceed the memory ``device`` has available."""
    if not checking():
        return
    needed = parameters * BYTES_PER_WEIGHT[dtype]
    available = available_bytes(device)
    if needed <= available:
        return
    leaner = " --dtype bfloat16 (half of float32)," if BYTES_PER_WEIGHT[dtype] > SMALLEST_RUN else ""
    elsewhere = " --device cuda," if device != "cuda" else ""
    raise RagidxError(
        f"model '{model}' does not fit: {parameters / 1e9:.2f}B weights need {_gb(needed)} in {dtype} "
        f"and {device} has {_gb(available)} available; use{leaner}{elsewhere} a smaller model file, or "
        "free memory (RAGIDX_MEMORY_CHECK=0 skips this check)"
    )


def disk_free(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def check_disk(model: str, parameters: int, folder: Path) -> None:
    """Refuse to start a conversion the cache's disk cannot hold (16-bit weights)."""
    needed = int(parameters * SMALLEST_RUN * DISK_MARGIN)
    free = disk_free(folder)
    if needed > free:
        raise RagidxError(
            f"model '{model}' needs {_gb(needed)} of disk for its converted copy in {folder}, which has "
            f"{_gb(free)} free; free space there or set RAGIDX_CACHE_DIR to a larger disk"
        )


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"
