"""Builds and searches through the CLI, as the index-lifecycle and fault tests run them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import ragidx


def build(corpus: Path, index: Path, model: Path, *extra: str, env: dict | None = None) -> dict:
    args = ("build", corpus, "--model", model, "--index", index, "--json", *extra)
    return json.loads(ragidx(*args, env=env).stdout)


def search_all(index: Path, queries: list[str]) -> list[list[tuple[int, float]]]:
    from ragidx.app import Index

    with Index.open(index, device="cpu") as opened:
        return [[(h.chunk_id, round(h.score, 5)) for h in opened.search(q, k=5)] for q in queries]


QUERIES = ["keeping ships off the rocks", "compost heap smells", "password reset link"]
