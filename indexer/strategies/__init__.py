"""Strategy registry: names to classes, and the default for a model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import BatchSettings, Role, Strategy
from ragidx.indexer.strategies.baselines import LastTokenPooling, MeanPooling
from ragidx.indexer.strategies.contrastive import ContrastivePrompting
from ragidx.indexer.strategies.echo import Echo
from ragidx.indexer.strategies.kv_embedding import KVEmbedding
from ragidx.indexer.strategies.prompts import KnowledgePrompt, PretendedCoT, PromptEOL
from ragidx.indexer.strategies.token_prepending import GlobalTokenPrepending, HierarchicalTokenPrepending
from ragidx.indexer.strategies.value_aggregation import AlignedWeightedValues, ValueVectors, WeightedValues

if TYPE_CHECKING:
    from ragidx.indexer.runtime import ModelRuntime

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        MeanPooling,
        LastTokenPooling,
        PromptEOL,
        PretendedCoT,
        KnowledgePrompt,
        ContrastivePrompting,
        Echo,
        KVEmbedding,
        HierarchicalTokenPrepending,
        GlobalTokenPrepending,
        AlignedWeightedValues,
        WeightedValues,
        ValueVectors,
    )
}
COMMON_PARAMS = frozenset({"document_template", "query_template", "max_length", "batch"})

__all__ = [
    "REGISTRY",
    "BatchSettings",
    "Role",
    "Strategy",
    "bfloat16_ok",
    "create_strategy",
    "default_strategy_name",
    "strategy_from_index",
]


def strategy_class(name: str) -> type[Strategy]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise RagidxError(f"unknown strategy '{name}': choose one of {', '.join(REGISTRY)}") from None


def bfloat16_ok(names: Iterable[str | None]) -> bool:
    """Whether every named strategy may run in bfloat16 (``None`` and ``auto`` pick only ones that may)."""
    return all(strategy_class(name).bfloat16_ok for name in names if name not in (None, "auto"))


def default_strategy_name(runtime: ModelRuntime) -> str:
    """PromptEOL for decoders (the strongest strategy shipped so far), mean pooling for encoders."""
    return "prompteol" if runtime.arch.is_decoder else "mean"


def strategy_from_index(name: str, runtime: ModelRuntime, stored: dict[str, Any], **given: Any) -> Strategy:
    """The strategy an index was built with: its stored parameters (upgraded from older
    versions), with the ``given`` ones replacing them."""
    return create_strategy(name, runtime, **{**strategy_class(name).upgrade_params(stored), **given})


def load_index_strategy(
    meta: dict[str, Any], device: str = "auto", dtype: str | None = None, trust_remote_code: bool = False
) -> Strategy:
    """The model and strategy an index was built with, loaded; a changed GGUF file is refused."""
    from ragidx.indexer.models import check_same_file, resolve_model
    from ragidx.indexer.runtime import load_runtime

    source = resolve_model(meta["model"])
    check_same_file(source, meta.get("model_file"))
    allowed = bfloat16_ok([meta["strategy"]])
    runtime = load_runtime(source, device, dtype or meta.get("dtype", "auto"), trust_remote_code, allowed)
    return strategy_from_index(meta["strategy"], runtime, meta["strategy_params"])


def create_strategy(name: str, runtime: ModelRuntime, **params: Any) -> Strategy:
    """Build a strategy from its name and stored or user-given parameters.

    Options a strategy does not take are refused by name, so ``--layers`` with ``mean`` is an
    error rather than silently ignored.
    """
    cls = strategy_class(name)
    foreign = sorted(set(params) - COMMON_PARAMS - cls.options)
    if foreign:
        flags = ", ".join("--" + key.replace("_", "-") for key in foreign)
        raise RagidxError(f"{flags} does not apply to strategy '{name}'")
    return cls(runtime, **params)
