"""Small GGUF files written with the gguf library, for the conversion tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_gguf(path: Path, architecture: str = "llama", dtype: type = np.float32) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((16, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((8, 8), dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
