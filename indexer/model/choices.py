"""What a user may name for a model to run on: the default model, devices and precisions. Kept
apart from the runtime (which imports the model stack) so the CLI can declare its options cheaply."""

from __future__ import annotations

import os

DEFAULT_MODEL = "minilm"  # measured best per minute of build among the offline models: docs/choosing.md
DEFAULT_DECODER = "gemma3-270m"  # the best offline decoder (docs/choosing.md): what `calibrate` tunes
DEVICES = ("auto", "cpu", "cuda", "mps")
# int8 (and float16 on a CPU): int8 (float16) weights, float32 products
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")


MODEL_VARIABLE = "RAGIDX_MODEL"


def default_model() -> str:
    """``$RAGIDX_MODEL`` (handy for a local folder when offline) or the built-in default."""
    return os.environ.get(MODEL_VARIABLE) or DEFAULT_MODEL
