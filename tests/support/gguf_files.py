"""Small GGUF files written with the gguf library, for the conversion tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_gguf(
    path: Path,
    architecture: str = "llama",
    dtype: type = np.float32,
    pooling: int | None = None,
    causal: bool | None = None,
) -> Path:
    """A one-layer file; ``pooling`` and ``causal`` mark it as llama.cpp marks an embedding model."""
    from gguf import GGUFWriter, PoolingType

    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    if pooling is not None:
        writer.add_pooling_type(PoolingType(pooling))
    if causal is not None:
        writer.add_causal_attention(causal)
    writer.add_tensor("token_embd.weight", np.ones((16, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((8, 8), dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
