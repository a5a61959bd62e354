"""Convert a GGUF model once into a plain model folder in the cache, keyed by the file's SHA-256.

transformers reads GGUF by dequantising every tensor, which takes 15-60 s on two cores; the
dequantised weights (safetensors) and the tokenizer (tokenizer.json) are saved so that later
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from ragidx.indexer.cache import cache_dir
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.faults import checkpoint
from ragidx.indexer.model.quiet import quiet_transformers


@dataclass(frozen=True)
class GgufFile:
    """A GGUF model as one file or as parts that concatenate into one; identified by SHA-256."""

    parts: tuple[Path, ...]
    expected_sha256: str | None = None

    @functools.cached_property
    def sha256(self) -> str:
        """Read first of all, so an unreadable file is named as such, not blamed on the cache."""
        digest = hashlib.sha256()
        for part in self.parts:
            try:
                with part.open("rb") as file:
                    while block := file.read(1 << 22):
                        digest.update(block)
            except OSError as error:
                raise RagidxError(f"cannot read model file {part}: {error.strerror or error}") from None
        return digest.hexdigest()

    def record(self) -> dict[str, Any]:
        """What an index stores to notice a changed file later."""
        return {"path": [str(part) for part in self.parts], "sha256": self.sha256}


# GGUF names of the architectures ragidx supports (llama.cpp writes Mistral models as "llama").
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3")
MANIFEST = "ragidx-gguf.json"  # written last: its presence marks a complete conversion
KILL_POINT = "gguf-convert"  # RAGIDX_KILL_AT=gguf-convert: die with the conversion written, not yet renamed


def models_cache() -> Path:
    return cache_dir() / "models"


def is_converted(gguf: GgufFile) -> bool:
    return (models_cache() / gguf.sha256 / MANIFEST).is_file()


def converted_folder(gguf: GgufFile) -> Path:
    """The converted model folder for ``gguf``, converting it first if no complete copy exists."""
    folder = models_cache() / gguf.sha256
    if is_converted(gguf):
        return folder
    with _cache_errors(models_cache()):
        models_cache().mkdir(parents=True, exist_ok=True)
        with _conversion_lock(gguf):
            if is_converted(gguf):  # another process finished it while we waited
                return folder
            _remove_leftovers(gguf.sha256)
            check_gguf(gguf)
            print(f"converting {gguf.parts[0].name} once into {folder} ...", file=sys.stderr)
            partial = Path(tempfile.mkdtemp(prefix=f".{gguf.sha256}.", suffix=".partial", dir=models_cache()))
            try:
                _convert(gguf, partial)
                checkpoint(KILL_POINT)
                partial.rename(folder)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
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
    """Read the header: refuse a file that is not GGUF, a foreign architecture or an unreadable type,
    in a second rather than after a long dequantisation."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import _type_traits

    readable = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    first = gguf.parts[0]
    with first.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise RagidxError(f"'{first}' is not a GGUF file (it does not start with the GGUF magic bytes)")
    if len(gguf.parts) > 1:
        return  # parts are read once assembled; their checksum was verified already
    try:
        reader = GGUFReader(first)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        types = {tensor.tensor_type for tensor in reader.tensors}
    except Exception as error:  # the reader raises ValueError, KeyError or IndexError on damage
        raise RagidxError(f"'{first}' is not a readable GGUF file (truncated or damaged: {error})") from None
    if architecture not in GGUF_ARCHITECTURES:
        raise RagidxError(
            f"'{first}' holds a '{architecture}' model; ragidx reads GGUF models of the architectures "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )
    unreadable = sorted(t.name for t in types if t not in readable)
    if unreadable:
        raise RagidxError(
            f"'{first}' uses the quantisation type {', '.join(unreadable)}, which transformers cannot "
            "dequantise; use a file quantised as F32, F16, BF16, Q8_0, Q4_K or another common type"
        )


@contextlib.contextmanager
def _single_file(gguf: GgufFile, scratch: Path) -> Iterator[Path]:
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
def _bar_on_terminals_only() -> Iterator[None]:
    """transformers draws its dequantisation bar with plain tqdm, even into logs and pipes; like
    ragidx's own bars it shows on a terminal only (``disable=None``)."""
    from unittest import mock

    import transformers.modeling_gguf_pytorch_utils as gguf_loading
    from tqdm.auto import tqdm

    with mock.patch.object(gguf_loading, "tqdm", functools.partial(tqdm, disable=None)):
        yield


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """transformers reads the GGUF file three times (config, tokenizer, weights), each time parsing
    every metadata field anew: for Gemma 3's 262k-token vocabulary that is most of a conversion.
    One reader per file serves all three (it is only ever read)."""
    from unittest import mock

    import gguf as gguf_library

    with mock.patch.object(
        gguf_library, "GGUFReader", functools.lru_cache(maxsize=1)(gguf_library.GGUFReader)
    ):
        yield


def _convert(gguf: GgufFile, target: Path) -> None:
    """Dequantise into float32 safetensors plus tokenizer files in ``target``, manifest last."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    quiet_transformers()
    started = time.perf_counter()
    with _single_file(gguf, target) as path, _bar_on_terminals_only(), _parsed_once():
        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        except (ValueError, KeyError, NotImplementedError, RuntimeError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RagidxError(
                f"transformers could not read the GGUF model '{gguf.parts[0]}': {detail}"
            ) from None
    config = model.config
    # The tensors are already dequantised floats; only the GGUF marks would stop a plain save.
    model.hf_quantizer = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    manifest = {
        **gguf.record(),
        "model_type": config.model_type,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    _fsync_folder(target)


def _fsync_folder(folder: Path) -> None:
    """Make the files durable before the rename publishes them (a power cut must not leave a
    complete-looking folder with empty files)."""
    for path in [*folder.iterdir(), folder]:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
