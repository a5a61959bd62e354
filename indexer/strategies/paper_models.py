"""Config fingerprints of the models the papers report settings for, and of the packaged models
ragidx measured its own defaults on.

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

QWEN3_4B = {"model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36, "intermediate_size": 9728}
MISTRAL_7B_V01 = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "vocab_size": 32000,
    "sliding_window": 4096,
}
LLAMA31_8B = {**LLAMA3_8B, "max_position_embeddings": 131072}
SMOLLM2_135M = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152}
GEMMA3_270M = {"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 18, "vocab_size": 262144}

LayerTable = tuple[tuple[str, dict[str, Any], tuple[int, ...]], ...]


def is_model(config: Any, fingerprint: dict[str, Any]) -> bool:
    return all(getattr(config, key, None) == value for key, value in fingerprint.items())


def paper_layers(config: Any, table: LayerTable) -> tuple[list[int], str] | None:
    """The layer set a paper reports for this model, with where it came from; None if it names none."""
    for name, fingerprint, layers in table:
        if is_model(config, fingerprint):
            return list(layers), f"paper ({name})"
    return None
