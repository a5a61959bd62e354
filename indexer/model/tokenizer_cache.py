"""Loading a model's tokenizer fast, with exactly ``AutoTokenizer``'s ids.

``AutoTokenizer`` builds some tokenizers through their model-specific class, which can rebuild the
pipeline in ``tokenizer.json`` (transformers 5's Qwen 2 class splits digits one by one whatever the
file says) and takes seconds on a large vocabulary (Gemma 3's 33 MB file: 2.5 s). So the first load
of a folder's tokenizer goes through ``AutoTokenizer``; the pipeline it built is saved in the cache,
checked to give its ids on probe texts, and later loads read that file with the generic fast class
(0.9 s for Gemma 3). A pipeline that does not reproduce the ids is remembered as such and always
loaded through ``AutoTokenizer``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ragidx.indexer.cache import cache_dir

# Files that define a tokenizer; their bytes (and transformers' version) name its cache entry.
# config.json too: without a tokenizer_class, its model type picks AutoTokenizer's class.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "config.json",
)
# Texts the saved pipeline must tokenize as AutoTokenizer does: digits, spacing, Unicode, specials.
PROBE_TEXTS = (
    "Sentence number 1 of 2024 talks about 3.14159 lighthouse keepers, don't they?",
    "  leading spaces, ÜNÏCÖDE, emoji 🌊, CJK 日本の首都は東京です, tabs\tand\nlines  ",
    "<PST> looks special but is not one; neither is [SEP] or <|im_end|> in text",
    "camelCaseWords snake_case_words URLs https://example.org/a?b=1 and e-mail a@b.co",
)
SAVED = "tokenizer.json"
SPECIALS = "special_tokens.json"  # the special tokens and limits; {"exact": false} if not reproducible


def load_tokenizer(location: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer of the model at ``location`` (a folder or a hub id), with AutoTokenizer's ids."""
    from transformers import AutoTokenizer

    folder = Path(location)
    if trust_remote_code or not (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    entry = tokenizers_cache() / _fingerprint(folder)
    specials = _read_specials(entry)
    if specials is None:
        auto = AutoTokenizer.from_pretrained(location)
        _save(entry, auto)
        return auto
    if not specials.pop("exact", True):
        return AutoTokenizer.from_pretrained(location)
    return _generic(entry / SAVED, specials)


def tokenizers_cache() -> Path:
    return cache_dir() / "tokenizers"


def _fingerprint(folder: Path) -> str:
    """SHA-256 of the tokenizer's files and of transformers' version (which decides the pipeline)."""
    import transformers

    digest = hashlib.sha256(transformers.__version__.encode())
    for name in TOKENIZER_FILES:
        path = folder / name
        digest.update(name.encode() + (path.read_bytes() if path.is_file() else b"\0"))
    return digest.hexdigest()


def _read_specials(entry: Path) -> dict[str, Any] | None:
    try:
        specials = json.loads((entry / SPECIALS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return specials if isinstance(specials, dict) else None


def _specials_of(tokenizer: Any) -> dict[str, Any]:
    """What the generic class needs beside the pipeline to behave as ``tokenizer`` does."""
    specials: dict[str, Any] = {str(k): v for k, v in tokenizer.special_tokens_map.items()}
    extra = [str(token) for token in getattr(tokenizer, "extra_special_tokens", []) or []]
    if extra:
        specials["extra_special_tokens"] = extra
    limits = {"model_max_length": tokenizer.model_max_length, "padding_side": tokenizer.padding_side}
    return {**specials, **limits}


def _generic(pipeline: Path, specials: dict[str, Any]) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(pipeline), **specials)


def _save(entry: Path, auto: Any) -> None:
    """Save ``auto``'s pipeline and special tokens, and whether they reproduce its ids, whole (a
    reader never sees half an entry); a read-only cache only costs the slow load next time."""
    if not getattr(auto, "is_fast", False):
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".partial", dir=entry.parent))
    except OSError:
        return
    try:
        auto.backend_tokenizer.save(str(partial / SAVED))
        specials = _specials_of(auto)
        exact = _same_ids(_generic(partial / SAVED, specials), auto)
        (partial / SPECIALS).write_text(json.dumps({**specials, "exact": exact}), encoding="utf-8")
        os.replace(partial, entry)  # fails if a twin process saved it first: then it is there
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)


def _same_ids(generic: Any, auto: Any) -> bool:
    for added in (True, False):
        ours = generic(list(PROBE_TEXTS), add_special_tokens=added, return_offsets_mapping=True)
        theirs = auto(list(PROBE_TEXTS), add_special_tokens=added, return_offsets_mapping=True)
        if ours["input_ids"] != theirs["input_ids"] or ours["offset_mapping"] != theirs["offset_mapping"]:
            return False
    return generic.all_special_ids == auto.all_special_ids and len(generic) == len(auto)
