"""How many rows and padded tokens one forward pass takes: fixed on a CPU, what free memory holds
on a GPU.

On a CPU a forward over 16K padded tokens already keeps every core busy, and a larger one only
holds more memory. On a GPU a forward over 32 short rows is a few hundred tokens: too little work
to fill the card, so a small model's build waits on kernel launches. There the batch grows to what
half of the memory left after loading holds, counted from the model's widths, up to a cap past
which throughput no longer grew (docs/gpu.md). Rows and tokens the user gives always win.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

CPU_ROWS = 32
CPU_TOKENS = 16384
GPU_MEMORY_SHARE = 0.5  # of the free memory after loading: the rest for the allocator's caching
GPU_MAX_TOKENS = 65536  # padded tokens a forward takes at most on a GPU
GPU_MIN_TOKENS = 2048  # and at least: what memory's fit check keeps free on a GPU (memory.device_reserve)
ROW_TOKENS = 16  # a GPU batch's rows: its tokens over this, so that short texts still fill it
LIVE_WIDTHS = 4  # activations alive at once: residual, normed input, attention or MLP outputs


@dataclass(frozen=True)
class BatchSettings:
    """How many rows and padded tokens one forward pass may take; never changes a vector."""

    max_rows: int = CPU_ROWS
    max_tokens: int = CPU_TOKENS


def activation_bytes_per_token(config: Any, element_bytes: int) -> int:
    """Bytes one token's activations hold at a forward's widest point: a few copies of the hidden
    state and of the MLP's intermediate (gate, up, their product), in the compute dtype."""
    hidden = int(config.hidden_size)
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    return LIVE_WIDTHS * (hidden + intermediate) * element_bytes


def gpu_batch(free_bytes: int, per_token_bytes: int) -> BatchSettings:
    """The batch a GPU with ``free_bytes`` left after loading takes: what half of that holds, in
    whole thousands of tokens, at most :data:`GPU_MAX_TOKENS` and at least :data:`GPU_MIN_TOKENS`
    (a card the weights nearly fill takes small batches rather than none: on an H100 left 0.6 GiB
    by an 8B model's bf16 weights, a floor at the CPU's 16,384 tokens ran out of memory down to
    one row, where cuBLAS failed)."""
    fits = int(free_bytes * GPU_MEMORY_SHARE) // per_token_bytes // 1024 * 1024
    tokens = max(GPU_MIN_TOKENS, min(GPU_MAX_TOKENS, fits))
    return BatchSettings(max_rows=tokens // ROW_TOKENS, max_tokens=tokens)


class LoadedModel(Protocol):
    """What sizing a batch reads of a loaded model (a :class:`~ragidx.indexer.model.runtime.ModelRuntime`,
    which this module does not import: the runtime imports it)."""

    @property
    def device(self) -> Any: ...  # torch.device

    @property
    def dtype(self) -> Any: ...  # torch.dtype

    @property
    def model(self) -> Any: ...  # the network, whose ``config`` gives its widths


def device_batch(runtime: LoadedModel, rows: int | None = None, tokens: int | None = None) -> BatchSettings:
    """``rows`` and ``tokens`` where given, else the device's: :func:`gpu_batch` on CUDA, else the
    CPU's fixed 32 rows and 16,384 tokens."""
    default = BatchSettings()
    if runtime.device.type == "cuda" and (rows is None or tokens is None):
        import torch

        free = int(torch.cuda.mem_get_info(runtime.device)[0])
        per_token = activation_bytes_per_token(runtime.model.config, runtime.dtype.itemsize)
        default = gpu_batch(free, per_token)
    return BatchSettings(rows or default.max_rows, tokens or default.max_tokens)
