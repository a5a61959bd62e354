"""A plugin for simonw's `llm` (https://llm.datasette.io/): an index's passages as a fragment,
``llm -f 'ragidx:QUESTION' ...``, and as a tool the model may call, ``llm -T Ragidx ...``.

`llm` imports this module (the ``llm`` entry point in pyproject.toml) for every command it runs,
so it imports nothing heavy. Each ``llm`` command is a process of its own: the search goes to the
per-user daemon, which keeps the index's model loaded, as ``ragidx query --context`` does
(:class:`~ragidx.app.daemon.index_request.IndexRequest`), and gives the same passages.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import llm

import ragidx.app as api
from ragidx.app.daemon.index_request import IndexRequest
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.context import DEFAULT_MAX_TOKENS as DEFAULT_CONTEXT_TOKENS

DEFAULT_K = 10  # hits merged into passages, as `ragidx query --context`
NO_PASSAGES = "no passages found"


def context(
    question: str, index: str | None = None, k: int = DEFAULT_K, max_tokens: int = DEFAULT_CONTEXT_TOKENS
) -> dict[str, Any]:
    """``ragidx query QUESTION --context --json`` on ``index`` (default: ``$RAGIDX_INDEX``, else
    ``./.ragidx``): numbered passages citing their sources, at most ``max_tokens`` tokens of the
    index's model's tokenizer."""
    directory = os.path.abspath(index or api.default_index_dir())
    opened = IndexRequest(directory, "auto", None, None, None, no_daemon=False)
    return opened.context(question, {"k": k}, max_tokens=max_tokens, relative_to=os.getcwd())


def question_fragment(question: str) -> llm.Fragment:
    """The passages that answer QUESTION, numbered [n] with their sources, from the ragidx index at
    $RAGIDX_INDEX (else ./.ragidx): llm -f 'ragidx:QUESTION' ..."""
    found = context(question)
    if not found["passages"]:
        raise RagidxError(f"{NO_PASSAGES} for {question!r}")
    return llm.Fragment(found["text"], f"ragidx:{question}")


class Ragidx(llm.Toolbox):
    """Search a ragidx index: ``-T Ragidx`` (``$RAGIDX_INDEX``, else ``./.ragidx``), or
    ``-T 'Ragidx("my-index")'``, ``-T 'Ragidx(index="my-index", k=5, max_tokens=1000)'``."""

    def __init__(
        self, index: str | None = None, k: int = DEFAULT_K, max_tokens: int = DEFAULT_CONTEXT_TOKENS
    ):
        self.index = os.path.abspath(index or api.default_index_dir())
        self.k = k
        self.max_tokens = max_tokens

    def search(self, query: str) -> str:
        """Search the user's documents: numbered passages [n] with their sources, to cite as [n]."""
        return context(query, self.index, self.k, self.max_tokens)["text"] or NO_PASSAGES


@llm.hookimpl
def register_fragment_loaders(register: Callable[..., None]) -> None:
    register("ragidx", question_fragment)


@llm.hookimpl
def register_tools(register: Callable[..., None]) -> None:
    register(Ragidx)
