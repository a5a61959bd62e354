"""Independent computations a strategy or a converted model is checked against: plain forward
passes, eager readouts, transformers' own tokenizer and GGUF conversion."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ragidx.indexer.model.runtime import Batch
from ragidx.indexer.strategies.base import l2_normalise

if TYPE_CHECKING:
    from ragidx.indexer.model.sources import ModelSource

# One strategy per mechanism: whole-forward pooling, value hooks with early exit, re-routed attention,
# placeholders, two passes. Where a check is per model rather than per strategy, these stand for all.
ONE_PER_MECHANISM = ["mean", "aligned-wva", "kv-embedding", "htp", "cp"]

# Texts whose tokens two tokenizers must agree on: prose, digits, odd whitespace and scripts, look-alike
# special tokens, and one longer than most models' context.
TOKENIZER_TEXTS = [
    "Why are there two tides a day? The Moon pulls the near-side ocean.",
    "Sentence number 1 of 9 and 2024's 3.5 tides",
    "  leading spaces, ÜNÏCÖDE, emoji 🌊, CJK 日本の首都は東京です, tabs\tand\nlines  ",
    "<PST> looks special but is not one; neither is [SEP] in text",
    "x" * 600,
]


def plain_final_states(model, tokenizer, text: str) -> torch.Tensor:
    """Final hidden states (after the final norm) of one unpadded sequence."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state[0]


def unit(vector: torch.Tensor) -> np.ndarray:
    vector = vector.double().numpy()
    return vector / np.linalg.norm(vector)


def eager_vector(strategy, text: str) -> np.ndarray:
    """The readout of the text's one-row batch, run as written (hooks, early exit and all)."""
    ids = torch.tensor([strategy.token_ids(text, "query")])
    with torch.inference_mode():
        vector = strategy.readout(Batch.single(ids), ())
    return l2_normalise(vector.float().numpy())[0]


def assert_same_tokenizer(fast, auto) -> None:
    """The same ids (with and without special tokens), offsets, size and special tokens."""
    for added in (True, False):
        ours = fast(TOKENIZER_TEXTS, add_special_tokens=added, return_offsets_mapping=True)
        theirs = auto(TOKENIZER_TEXTS, add_special_tokens=added, return_offsets_mapping=True)
        assert ours["input_ids"] == theirs["input_ids"]
        assert ours["offset_mapping"] == theirs["offset_mapping"]
    assert len(fast) == len(auto) and fast.all_special_ids == auto.all_special_ids
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token"):
        assert getattr(fast, name) == getattr(auto, name), name


def assert_cache_equals_transformers(source: ModelSource, scratch: Path) -> None:
    """Each tensor of ``source``'s converted cache equals transformers' float32 conversion of the
    same GGUF rounded to bf16, and the cache holds exactly the base model's weights."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModel

    from ragidx.indexer.model.gguf import parsed_once, single_file

    folder = Path(source.loadable())
    with single_file(source.gguf, scratch) as path, parsed_once():
        direct = AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    expected = direct.state_dict()
    got = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as weights:
            got |= {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118 - not a dict
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == torch.bfloat16, name
        assert torch.equal(got[name], tensor.to(torch.bfloat16)), name
