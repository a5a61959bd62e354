"""Config fingerprints of the models the papers report settings for.

Recognising a model by its config rather than its name means a renamed or locally saved copy
still gets the paper's settings.
"""

from __future__ import annotations

from typing import Any

LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
}
LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288}


def is_model(config: Any, fingerprint: dict[str, Any]) -> bool:
    return all(getattr(config, key, None) == value for key, value in fingerprint.items())
