"""Convert a GGUF model once into a plain model folder in the cache, keyed by the file's SHA-256.

The weights are dequantised a tensor at a time into 16-bit safetensors (memory holds one shard
and one tensor: an 8B model converts on a laptop), with the tokenizer (tokenizer.json), so later
loads take seconds. A conversion is written into a private temporary folder and renamed into
place only when complete, under a lock, so two processes converting the same file at once do the
work once and no half-written folder is ever loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version
from safetensors import SafetensorError

from ragidx.indexer.cache import cache_dir, read_json_cache, write_json_cache
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.faults import checkpoint
from ragidx.indexer.model.embedding_card import GGUF_RANK_POOLING
from ragidx.indexer.model.memory import check_disk
from ragidx.indexer.model.quiet import quiet_transformers
from ragidx.indexer.progress import progress


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's header says, read without touching its tensor data."""

    architecture: str
    types: frozenset[str]  # the GGML type names of its tensors (F32, Q8_0, Q4_K, ...)
    parameters: int
    pooling: int = 0  # llama.cpp's pooling type for an embedding model (0: none, a plain decoder)
    causal: bool = True  # False: an embedder that attends both ways (llama.cpp's attention.causal)


def _read_header(path: Path, shown: str) -> GgufHeader:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        pooling = reader.fields.get(f"{architecture}.pooling_type")
        causal = reader.fields.get(f"{architecture}.attention.causal")
        return GgufHeader(
            architecture=architecture,
            types=frozenset(tensor.tensor_type.name for tensor in reader.tensors),
            parameters=sum(int(tensor.n_elements) for tensor in reader.tensors),
            pooling=int(pooling.contents()) if pooling is not None else 0,
            causal=bool(causal.contents()) if causal is not None else True,
        )
    except Exception as error:  # the reader raises ValueError, KeyError or IndexError on damage
        raise RagidxError(f"'{shown}' is not a readable GGUF file (truncated or damaged: {error})") from None


@dataclass(frozen=True)
class GgufFile:
    """A GGUF model as one file or as parts that concatenate into one; identified by SHA-256."""

    parts: tuple[Path, ...]
    expected_sha256: str | None = None
    digest: str | None = None  # the SHA-256 a content-addressed store names it by (Ollama's blobs)
    label: str | None = None  # how messages name it (an Ollama model's name); else its path

    @property
    def shown(self) -> str:
        return self.label or str(self.parts[0])

    @functools.cached_property
    def sha256(self) -> str:
        """The content's SHA-256: a store's digest, else remembered for an unchanged file (path, size,
        mtime and inode as at its last hashing: an 8B file takes seconds to read), else read, first
        of all, so that an unreadable file is named as such, not blamed on the cache."""
        if self.digest:
            return self.digest
        remembered = remembered_sha256(self.parts)
        if remembered:
            return remembered
        digest = hashlib.sha256()
        for part in self.parts:
            try:
                with part.open("rb") as file:
                    while block := file.read(1 << 22):
                        digest.update(block)
            except OSError as error:
                raise RagidxError(f"cannot read model file {part}: {error.strerror or error}") from None
        remember_sha256(self.parts, digest.hexdigest())
        return digest.hexdigest()

    @functools.cached_property
    def header(self) -> GgufHeader | None:
        """The header of a single-file GGUF (parts are read once assembled: None), remembered by
        SHA-256 (the gguf library parses every field: 2 s for SmolLM2, ~10 s for a 262k-token
        vocabulary), or a one-line refusal of a file that is not GGUF or is damaged."""
        first = self.parts[0]
        with first.open("rb") as file:
            if file.read(4) != b"GGUF":
                raise RagidxError(
                    f"'{self.shown}' is not a GGUF file (it does not start with the magic bytes GGUF)"
                )
        if len(self.parts) > 1:
            return None
        known = read_json_cache(models_cache() / HEADERS)
        with contextlib.suppress(KeyError, TypeError):
            entry = known[self.sha256]  # one written before a field was added lacks it: read anew
            return GgufHeader(
                entry["architecture"],
                frozenset(entry["types"]),
                int(entry["parameters"]),
                int(entry["pooling"]),
                bool(entry["causal"]),
            )
        header = _read_header(first, self.shown)
        entry = {**asdict(header), "types": sorted(header.types)}
        write_json_cache(models_cache() / HEADERS, {**known, self.sha256: entry})
        return header

    def record(self) -> dict[str, Any]:
        """What an index stores to notice a changed file later."""
        return {"path": [str(part) for part in self.parts], "sha256": self.sha256}


# GGUF names of the architectures ragidx supports (llama.cpp writes Mistral models as "llama").
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3")
# llama.cpp's names of embedding encoders, which transformers cannot read from GGUF: bge-m3 and
# other BERT or XLM-RoBERTa models ("bert"), nomic-embed-text, Jina's, EmbeddingGemma.
GGUF_ENCODERS = ("bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "gemma-embedding")
MANIFEST = "ragidx-gguf.json"  # written last: its presence marks a complete conversion
# The first transformers that converts every packaged model's GGUF tokenizer whole (before it,
# Gemma 3's lost its <bos>; before 5.18 it was cut into characters): a cache made earlier is redone.
TOKENIZERS_RIGHT_FROM = "5.23"
CACHE_DTYPE = "bfloat16"  # the converted weights' type (see docs/models.md: measured against float32)
CACHE_TAG = {"bfloat16": "bf16", "float16": "f16"}[CACHE_DTYPE]
SHARD_BYTES = 256 * 2**20  # memory holds one shard while it is written, and while it is packed at load
ROWS_AT_ONCE = 8192  # rows of a big tensor dequantised to float32 at once (Llama-3's embedding: 128 MiB)
KILL_POINT = "gguf-convert"  # RAGIDX_KILL_AT=gguf-convert: die with the conversion written, not yet renamed


def models_cache() -> Path:
    return cache_dir() / "models"


HASHES = "hashes.json"  # in models_cache(): a single GGUF file's SHA-256 by path, size, mtime, inode
HEADERS = "headers.json"  # in models_cache(): a GGUF file's header facts by SHA-256


def _stamp(path: Path) -> dict[str, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return {"size": status.st_size, "mtime_ns": status.st_mtime_ns, "inode": status.st_ino}


def remembered_sha256(parts: tuple[Path, ...]) -> str | None:
    """The SHA-256 hashed before for this single file, if it has not changed since."""
    stamp = _stamp(parts[0]) if len(parts) == 1 else None
    entry = read_json_cache(models_cache() / HASHES).get(str(parts[0])) if stamp else None
    if not isinstance(entry, dict) or {key: entry.get(key) for key in stamp or {}} != stamp:
        return None
    sha256 = entry.get("sha256")
    return sha256 if isinstance(sha256, str) and len(sha256) == 64 else None


def remember_sha256(parts: tuple[Path, ...], sha256: str) -> None:
    stamp = _stamp(parts[0])
    if len(parts) == 1 and stamp is not None:
        known = read_json_cache(models_cache() / HASHES)
        known = {path: entry for path, entry in known.items() if Path(path).exists()}  # forget deleted files
        write_json_cache(models_cache() / HASHES, {**known, str(parts[0]): {**stamp, "sha256": sha256}})


def cache_folder(gguf: GgufFile) -> Path:
    """Where ``gguf``'s conversion lives: its SHA-256 and the weights' type (a float32 copy made by
    an earlier ragidx, ``<sha256>/``, is replaced once: :func:`converted_folder`)."""
    return models_cache() / f"{gguf.sha256}-{CACHE_TAG}"


def is_converted(gguf: GgufFile) -> bool:
    """Whether a complete, undamaged conversion of ``gguf`` is in the cache."""
    folder = cache_folder(gguf)
    return (folder / MANIFEST).is_file() and unusable_conversion(folder) is None


def unusable_conversion(folder: Path) -> str | None:
    """Why a finished conversion cannot be used: damaged (a file its manifest lists missing or of
    another size than written, or an unreadable manifest), or stale (made by a transformers older
    than :data:`TOKENIZERS_RIGHT_FROM`, or by a ragidx that did not record which)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        written = manifest.get("files", {})
    except (OSError, ValueError, AttributeError):
        return f"damaged (its manifest {MANIFEST} is unreadable)"
    for name, size in written.items():
        path = folder / name
        found = path.stat().st_size if path.is_file() else None
        if found != size:
            missing = f"{name} is missing" if found is None else f"{name} holds {found} of its {size} bytes"
            return f"damaged ({missing})"
    made_by = manifest.get("transformers")
    if not isinstance(made_by, str) or _older(made_by, TOKENIZERS_RIGHT_FROM):
        return (
            f"stale (made by transformers {made_by or 'of unrecorded version'}; before "
            f"{TOKENIZERS_RIGHT_FROM} a GGUF tokenizer could be converted wrongly)"
        )
    return None


def _older(version: str, than: str) -> bool:
    try:
        return Version(version) < Version(than)
    except InvalidVersion:
        return True


def converted_folder(gguf: GgufFile) -> Path:
    """The converted model folder for ``gguf``, converting it first if no complete copy exists."""
    folder = cache_folder(gguf)
    if is_converted(gguf):
        return folder
    with _cache_errors(models_cache()):
        models_cache().mkdir(parents=True, exist_ok=True)
        with _conversion_lock(gguf):
            if is_converted(gguf):  # another process finished it while we waited
                return folder
            if (folder / MANIFEST).is_file():
                print(
                    f"the converted copy {folder} is {unusable_conversion(folder)}: converting again",
                    file=sys.stderr,
                )
                shutil.rmtree(folder)
            _remove_leftovers(gguf.sha256)
            check_gguf(gguf)
            if gguf.header is not None:
                check_disk(gguf.shown, gguf.header.parameters, models_cache())
            print(f"converting {gguf.parts[0].name} once into {folder} ...", file=sys.stderr)
            partial = Path(tempfile.mkdtemp(prefix=f".{gguf.sha256}.", suffix=".partial", dir=models_cache()))
            try:
                _convert(gguf, partial)
                checkpoint(KILL_POINT)
                partial.rename(folder)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(models_cache() / gguf.sha256, ignore_errors=True)  # an earlier float32 copy
    return folder


@contextlib.contextmanager
def _cache_errors(root: Path) -> Iterator[None]:
    """A cache that cannot be written (read-only, full, not a folder) is one line, not a traceback."""
    try:
        yield
    except (OSError, SafetensorError) as error:  # safetensors reports a failed write as its own error
        reason = getattr(error, "strerror", None) or str(error)
        raise RagidxError(
            f"cannot write the converted model into the cache {root} ({reason}); free space there or "
            "set RAGIDX_CACHE_DIR to a writable folder"
        ) from error


@contextlib.contextmanager
def _conversion_lock(gguf: GgufFile) -> Iterator[None]:
    """Hold ``<sha>.lock`` while converting; a second process waits here, then reuses the result."""
    with open(models_cache() / f"{gguf.sha256}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("waiting for another ragidx process converting this model...", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _remove_leftovers(sha256: str) -> None:
    """Partial folders of this model left by a killed conversion (we hold the lock, so none is live)."""
    for leftover in models_cache().glob(f".{sha256}.*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)


def check_gguf(gguf: GgufFile) -> None:
    """Refuse a file that is not GGUF, a foreign architecture or an unreadable type from its header,
    in a second rather than after a long dequantisation."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits

    header = gguf.header
    if header is None:
        return  # parts are read once assembled; their checksum was verified already
    first = gguf.shown
    if header.architecture in GGUF_ENCODERS:
        raise RagidxError(
            f"'{first}' holds a '{header.architecture}' embedding encoder, which ragidx cannot read from "
            "GGUF; give its Hugging Face folder instead (--model FOLDER: BERT, RoBERTa and XLM-RoBERTa "
            f"encoders such as bge-m3), or a GGUF decoder ({', '.join(GGUF_ARCHITECTURES)})"
        )
    if header.pooling == GGUF_RANK_POOLING:
        raise RagidxError(
            f"'{first}' is a reranker (pooling_type RANK): it scores a query and a passage together "
            "and gives no embedding; use an embedding model or a decoder"
        )
    if not header.causal:
        raise RagidxError(
            f"'{first}' is an embedding model that attends both ways (attention.causal false); ragidx "
            "runs a decoder left to right only, which would read it wrongly"
        )
    if header.architecture not in GGUF_ARCHITECTURES:
        raise RagidxError(
            f"'{first}' holds a '{header.architecture}' model; ragidx reads GGUF models of the "
            f"architectures {', '.join(GGUF_ARCHITECTURES)}"
        )
    readable = {kind.name for kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits)}
    unreadable = sorted(header.types - readable)
    if unreadable:
        raise RagidxError(
            f"'{first}' uses the quantisation type {', '.join(unreadable)}, which transformers cannot "
            "dequantise; use a file quantised as F32, F16, BF16, Q8_0, Q4_K or another common type"
        )


@contextlib.contextmanager
def single_file(gguf: GgufFile, scratch: Path) -> Iterator[Path]:
    """The GGUF as one file: itself, or its parts concatenated into ``scratch`` for the conversion."""
    if len(gguf.parts) == 1:
        yield gguf.parts[0]
        return
    assembled = scratch / "assembled.gguf"
    with assembled.open("wb") as out:
        for part in gguf.parts:
            with part.open("rb") as file:
                shutil.copyfileobj(file, out, 1 << 22)
    try:
        yield assembled
    finally:
        assembled.unlink()


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """transformers reads the GGUF file's metadata for the config and again for the tokenizer,
    each time parsing every field anew (for Gemma 3's 262k-token vocabulary, seconds); one reader
    per file serves both and the tensors (it is only ever read)."""
    from unittest import mock

    import gguf as gguf_library

    with mock.patch.object(
        gguf_library, "GGUFReader", functools.lru_cache(maxsize=1)(gguf_library.GGUFReader)
    ):
        yield


def _convert(gguf: GgufFile, target: Path) -> None:
    """Write ``target``: the weights dequantised a tensor at a time (a big one a block of rows at a
    time) into 16-bit safetensors shards, then the config and tokenizer, the manifest last. Names and
    per-architecture processing (Llama's q/k permutation, Gemma's norm offsets) are transformers'
    own; memory holds one shard and one tensor, never the model in float32."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    quiet_transformers()
    started = time.perf_counter()
    with single_file(gguf, target) as path, parsed_once():
        try:
            parsed = load_gguf_checkpoint(str(path))
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        except (ValueError, KeyError, NotImplementedError, RuntimeError, OSError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RagidxError(
                f"transformers could not read the GGUF model '{gguf.shown}': {detail}"
            ) from None
        from gguf import GGUFReader

        reader = GGUFReader(path)
        _check_beginning_token(tokenizer, reader, gguf.shown)
        architecture = read_field(reader, "general.architecture")[0]
        processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
        with torch.device("meta"):
            skeleton = AutoModel.from_config(config)
        names = get_gguf_hf_weights_map(skeleton, processor)
        expected = set(skeleton.state_dict())
        del skeleton
        shards = ShardWriter(target, getattr(torch, CACHE_DTYPE))
        with progress(len(reader.tensors), "converting", "tensors") as bar:
            for tensor in reader.tensors:
                name = names.get(tensor.name)
                if name is not None:  # else a head the base model has no use for (output.weight)
                    shards.add(name, _dequantised(tensor, processor, shards.dtype))
                bar.update(1)
        written = shards.finish()
        del reader
    missing = sorted(expected - written)
    if missing:
        raise RagidxError(
            f"the GGUF model '{gguf.shown}' lacks weights the model needs: {', '.join(missing[:3])}"
        )
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = CACHE_DTYPE
    config.save_pretrained(target)
    tokenizer.save_pretrained(target)
    manifest = {
        **gguf.record(),
        "transformers": transformers.__version__,
        "model_type": config.model_type,
        "dtype": CACHE_DTYPE,
        "seconds": round(time.perf_counter() - started, 1),
        "files": {path.name: path.stat().st_size for path in sorted(target.iterdir()) if path.is_file()},
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    _fsync_folder(target)


def _check_beginning_token(tokenizer: Any, reader: Any, shown: str) -> None:
    """Refuse a conversion whose tokenizer drops the beginning-of-text token the GGUF file asks for
    (``tokenizer.ggml.add_bos_token``): transformers before 5.23 converted Gemma 3's that way (before
    5.18, into single characters too), and every vector of such ids is worthless (docs/gpu.md)."""
    field = reader.fields.get("tokenizer.ggml.add_bos_token")
    if field is None or not field.contents():
        return
    ids = tokenizer("a")["input_ids"]
    if not ids or ids[0] != tokenizer.bos_token_id:
        import transformers

        raise RagidxError(
            f"transformers {transformers.__version__} converts the tokenizer of '{shown}' without its "
            "beginning-of-text token; upgrade it: pip install -U 'transformers>=5.23'"
        )


def _dequantised(tensor: Any, processor: Any, dtype: Any) -> Any:
    """One GGUF tensor as a ``dtype`` torch tensor, processed as transformers processes it. A big
    tensor (the embedding) is dequantised :data:`ROWS_AT_ONCE` rows at a time, straight into its
    16-bit copy; the processing that needs a whole tensor (q/k permutation) only meets small ones."""
    import numpy as np
    import torch
    from gguf import dequantize

    data = tensor.data
    whole = (
        data.ndim < 2
        or data.shape[0] <= ROWS_AT_ONCE
        or ".attn_q." in tensor.name
        or ".attn_k." in tensor.name
    )
    blocks = [data] if whole else [data[i : i + ROWS_AT_ONCE] for i in range(0, data.shape[0], ROWS_AT_ONCE)]
    parts = []
    for block in blocks:
        weights = processor.process(weights=dequantize(block, tensor.tensor_type), name=tensor.name).weights
        # an F32 tensor arrives as a read-only view of the file, which torch will not wrap
        parts.append(torch.from_numpy(np.require(weights, requirements=["C", "W"])).to(dtype))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class ShardWriter:
    """Safetensors shards of at most :data:`SHARD_BYTES` (one file, ``model.safetensors``, when
    they all fit in one), with transformers' index file naming each weight's shard."""

    def __init__(self, folder: Path, dtype: Any):
        self.folder, self.dtype = folder, dtype
        self.pending: dict[str, Any] = {}
        self.size = 0
        self.files: list[str] = []
        self.where: dict[str, str] = {}

    def add(self, name: str, tensor: Any) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.size + nbytes > SHARD_BYTES:
            self._flush()
        self.pending[name] = tensor
        self.size += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        file = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, str(self.folder / file), metadata={"format": "pt"})
        self.files.append(file)
        self.where.update(dict.fromkeys(self.pending, file))
        self.pending, self.size = {}, 0

    def finish(self) -> set[str]:
        """Write what is left and the index (or rename a single shard); the names written."""
        self._flush()
        if len(self.files) == 1:
            (self.folder / self.files[0]).rename(self.folder / "model.safetensors")
        else:
            index = {"metadata": {}, "weight_map": self.where}
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
        return set(self.where)


def _fsync_folder(folder: Path) -> None:
    """Make the files durable before the rename publishes them (a power cut must not leave a
    complete-looking folder with empty files)."""
    for path in [*folder.iterdir(), folder]:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
