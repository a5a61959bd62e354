"""How a model trained as an embedder says it is read: its pooling, its prompts, a final token.

Embedding models (Qwen3-Embedding, gte-Qwen2, bge-m3, e5) were trained to be read one way — at
the last token, at [CLS] or as a mean, with a query instruction — and read another way their
vectors are poor. Their own files say which: a GGUF header's ``{arch}.pooling_type`` (what
llama.cpp and Ollama read), a model folder's sentence-transformers ``modules.json``, the Pooling
module's ``config.json`` and ``config_sentence_transformers.json``'s prompts. ragidx follows them
by default, rather than its default for a plain decoder or encoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# llama.cpp's enum llama_pooling_type, as GGUF files store it.
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}
GGUF_RANK_POOLING = 4  # a reranker's classification head: no embedding to read
# The query instruction of Qwen3-Embedding's card ("Instruct: {task}\nQuery:{query}", its default
# retrieval task). A GGUF file holds no prompt; its LAST-pooled models (Qwen3-Embedding,
# gte-Qwen2, e5-mistral) were all trained with this instruction format.
LAST_TOKEN_INSTRUCTION = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
SENTENCE_TRANSFORMERS_POOLING = (
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
)


@dataclass(frozen=True)
class EmbeddingCard:
    """The reading an embedding model's files ask for."""

    strategy: str  # the pooling strategy: last, cls or mean (last: read at the end-of-text token)
    source: str  # where it was read, for the strategy's stored reason
    query_prompt: str = ""
    document_prompt: str = ""

    @property
    def reason(self) -> str:
        prompt = " with its query instruction" if self.query_prompt else ""
        return f"{self.strategy} pooling{prompt}, from {self.source}"


def gguf_card(pooling: int) -> EmbeddingCard | None:
    """The card of a GGUF file whose header names a pooling type (None: a plain decoder)."""
    strategy = GGUF_POOLING.get(pooling)
    if strategy is None:
        return None
    source = f"its GGUF header (pooling_type {strategy.upper()})"
    if strategy == "last":
        return EmbeddingCard(strategy, source, query_prompt=LAST_TOKEN_INSTRUCTION)
    return EmbeddingCard(strategy, source)


def folder_card(folder: Path) -> EmbeddingCard | None:
    """The card of a sentence-transformers model folder (None: no such files, or a pooling ragidx
    does not read, such as max pooling)."""
    modules = _json(folder / "modules.json")
    pooling = next(
        (module for module in modules or [] if str(module.get("type", "")).endswith(".Pooling")), None
    )
    if pooling is None:
        return None
    config = _json(folder / str(pooling.get("path", "")) / "config.json") or {}
    strategy = next((name for key, name in SENTENCE_TRANSFORMERS_POOLING if config.get(key)), None)
    if strategy is None:
        return None
    prompts = (_json(folder / "config_sentence_transformers.json") or {}).get("prompts") or {}
    document = prompts.get("document", prompts.get("passage", ""))
    return EmbeddingCard(
        strategy,
        "its sentence-transformers files",
        query_prompt=str(prompts.get("query", "")),
        document_prompt=str(document),
    )


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
