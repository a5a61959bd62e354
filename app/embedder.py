"""Vectors without an index: a model and a strategy, loaded once (``ragidx embed --model``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ragidx.indexer.build.settings import split_strategy_options
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.runtime import load_runtime
from ragidx.indexer.roles import Role
from ragidx.indexer.strategies import Strategy, create_strategy, model_for, named_or_default

TEMPLATES = ("document_template", "query_template")


class Embedder:
    """Embeds texts as an index built with the same model, strategy and options would.

    ``options`` are the strategy's (``layers="20-27"``, ``prompt=...``) and its templates; a
    strategy refuses the ones it does not take. Without ``strategy`` the model's default is used.
    """

    def __init__(
        self,
        model: str | None = None,
        strategy: str | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        trust_remote_code: bool = False,
        **options: Any,
    ):
        given = split_strategy_options(options)
        templates = {name: options.pop(name) for name in TEMPLATES if options.get(name) is not None}
        if options:
            raise RagidxError(f"unknown embedding option {sorted(options)[0]!r}")
        loaded = model or model_for([strategy])
        runtime = load_runtime(loaded, device, dtype, trust_remote_code, strategy=strategy or "")
        self.model = runtime.model_id
        self.strategy: Strategy = create_strategy(
            named_or_default(strategy, runtime), runtime, **given, **templates
        )

    def embed(self, texts: Sequence[str], role: Role = "query") -> np.ndarray:
        """float32 unit vectors, one row per text."""
        return self.strategy.encode(list(texts), role)
