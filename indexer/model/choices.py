"""What a user may name for a model to run on: the default model, devices and precisions, and the
device ``auto`` names here. Kept apart from the runtime (which imports the model stack) so the CLI
can declare its options cheaply, and the search engine tell the device without the runtime."""

from __future__ import annotations

import os

from ragidx.indexer.errors import RagidxError

DEFAULT_MODEL = "minilm"  # measured best per minute of build among the offline models: docs/choosing.md
DEFAULT_DECODER = "gemma3-270m"  # the best offline decoder (docs/choosing.md): what `calibrate` tunes
DEVICES = ("auto", "cpu", "cuda", "mps")
# int8 (and float16 on a CPU): int8 (float16) weights, float32 products; w8a8: int8 x int8 products
# (a CPU's integer units: indexer/model/int8_products.py)
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "w8a8")


MODEL_VARIABLE = "RAGIDX_MODEL"


def default_model() -> str:
    """``$RAGIDX_MODEL`` (handy for a local folder when offline) or the built-in default."""
    return os.environ.get(MODEL_VARIABLE) or DEFAULT_MODEL


def resolve_device(device: str) -> str:
    """Turn ``auto`` into the best available device and refuse ones this machine lacks."""
    import torch

    if device not in DEVICES:
        raise RagidxError(f"unknown device '{device}': choose one of {', '.join(DEVICES)}")
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if device == "cuda" and not cuda:
        raise RagidxError("--device cuda was asked for but torch sees no CUDA GPU")
    if device == "mps" and not mps:
        raise RagidxError("--device mps was asked for but torch sees no Apple GPU")
    return device
