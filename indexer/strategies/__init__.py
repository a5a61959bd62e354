"""Strategy registry: names to classes, and the default for a model."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.choices import DEFAULT_DECODER, MODEL_VARIABLE, default_model
from ragidx.indexer.model.embedding_card import EmbeddingCard
from ragidx.indexer.model.runtime import ENCODER_TYPES, ModelRuntime
from ragidx.indexer.model.sources import PACKAGED_MODELS
from ragidx.indexer.strategies.base import COMMON_PARAMS, TEXT_SLOT, BatchSettings, Strategy
from ragidx.indexer.strategies.baselines import FirstTokenPooling, LastTokenPooling, MeanPooling
from ragidx.indexer.strategies.contrastive import ContrastivePrompting
from ragidx.indexer.strategies.echo import Echo
from ragidx.indexer.strategies.kv_embedding import KVEmbedding
from ragidx.indexer.strategies.options import OptionSpec, option_specs
from ragidx.indexer.strategies.paper_models import GEMMA3_270M, SMOLLM2_135M, is_model
from ragidx.indexer.strategies.prompts import KnowledgePrompt, PretendedCoT, PromptEOL
from ragidx.indexer.strategies.token_prepending import GlobalTokenPrepending, HierarchicalTokenPrepending
from ragidx.indexer.strategies.value_aggregation import AlignedWeightedValues, ValueVectors, WeightedValues

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        MeanPooling,
        LastTokenPooling,
        FirstTokenPooling,
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
# One CLI flag per option name over every strategy, derived from their Options declarations.
OPTION_SPECS: list[OptionSpec] = option_specs((name, cls.Options) for name, cls in REGISTRY.items())
# The best SciFact train nDCG@10 (dense, 500 abstracts, 200 claims) on each packaged decoder, also
# at or near the top on STS-B dev (docs/choosing.md). Other decoders get AlignedWVA:
# the best mean over both models on both tasks; KV-Embedding, best on Gemma 3, is last on SmolLM2.
MEASURED_DEFAULTS = (
    ("Gemma 3 270M", GEMMA3_270M, "kv-embedding"),
    ("SmolLM2-135M", SMOLLM2_135M, "aligned-wva"),
)
DECODER_DEFAULT = "aligned-wva"

__all__ = [
    "OPTION_SPECS",
    "REGISTRY",
    "BatchSettings",
    "Strategy",
    "auto_strategy",
    "create_strategy",
    "default_strategy",
    "model_for",
    "named_or_default",
    "strategy_defaults",
    "strategy_from_index",
    "strategy_rows",
]


def strategy_rows() -> list[dict[str, Any]]:
    """Each strategy: its name, what it computes, its paper, whether it needs a decoder, and the
    options it takes."""
    return [
        {
            "name": cls.name,
            "description": cls.description,
            "paper": cls.paper,
            "decoder_only": cls.decoder_only,
            "options": [spec.name for spec in OPTION_SPECS if spec.name in cls.Options.names()],
        }
        for cls in REGISTRY.values()
    ]


def strategy_defaults(attribute: str) -> tuple[Any, dict[str, Any]]:
    """A per-strategy default (``default_max_length``, ``default_chunk_tokens``): the value most
    strategies take, and the strategies that take another."""
    values = {name: getattr(cls, attribute) for name, cls in REGISTRY.items()}
    common = max(set(values.values()), key=list(values.values()).count)
    return common, {name: value for name, value in values.items() if value != common}


def strategy_class(name: str) -> type[Strategy]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise RagidxError(f"unknown strategy '{name}': choose one of {', '.join(REGISTRY)}") from None


def model_for(strategies: Iterable[str | None]) -> str:
    """The model to load where none is named: ``$RAGIDX_MODEL``, else the default model, unless a
    strategy asked needs a decoder, which the default model (an encoder) is not: then the default
    decoder, so that ``ragidx build ./docs --strategy htp`` works on a fresh install, as the design
    card writes it (not installed: the one line saying how to install it)."""
    needing = [name for name in strategies if name in REGISTRY and REGISTRY[name].decoder_only]
    if not needing or os.environ.get(MODEL_VARIABLE):
        return default_model()
    decoder = PACKAGED_MODELS[DEFAULT_DECODER]
    if decoder.paths() is None:
        raise RagidxError(
            f"strategy '{needing[0]}' needs a decoder-only LLM, and the default one, {DEFAULT_DECODER}, "
            f"is not installed: {decoder.install} (or name one with --model)"
        )
    return DEFAULT_DECODER


def default_strategy(config: Any, card: EmbeddingCard | None = None) -> tuple[str, str]:
    """The strategy for a model of ``config`` when none is given, and why: the pooling an embedding
    model's own files name (``card``), mean pooling for other encoders, the measured best for a
    packaged decoder, AlignedWVA for other decoders."""
    if card is not None:
        return card.strategy, card.reason
    if config.model_type in ENCODER_TYPES:
        return "mean", "default for encoder models"
    for model, fingerprint, name in MEASURED_DEFAULTS:
        if is_model(config, fingerprint):
            return name, f"measured default for {model}"
    return DECODER_DEFAULT, "default for decoder models"


def auto_strategy(config: Any, card: EmbeddingCard | None = None) -> tuple[str, str]:
    """``--strategy auto``: the model's default at every document length. HTP is the papers' choice
    for long documents, but on both packaged decoders the default beat it in dense search on SciFact
    abstracts and on QMSum meetings (10k-13k words), at HTP's 1,024-token chunks, at 256 and with
    whole meetings as input (docs/choosing.md), so no length was found where switching to it pays."""
    name, reason = default_strategy(config, card)
    if card is not None:
        return name, f"auto: {reason}"
    return name, f"auto: {reason}, also for long documents (htp lost to it on meetings)"


def named_or_default(name: str | None, runtime: ModelRuntime) -> str:
    """``name``, or the default strategy of the loaded model when none is given."""
    return name or default_strategy(runtime.model.config, runtime.card)[0]


def strategy_from_index(name: str, runtime: ModelRuntime, stored: dict[str, Any], **given: Any) -> Strategy:
    """The strategy an index was built with: its stored parameters (upgraded from older
    versions), with the ``given`` ones replacing them."""
    return create_strategy(name, runtime, **{**strategy_class(name).upgrade_params(stored), **given})


def create_strategy(name: str, runtime: ModelRuntime, **params: Any) -> Strategy:
    """Build a strategy from its name and stored or user-given parameters.

    Each option is checked against the strategy's ``Options`` declaration; one it does not take
    is refused by name, so ``--layers`` with ``mean`` is an error rather than silently ignored.
    """
    cls = strategy_class(name)
    common = {key: params.pop(key) for key in COMMON_PARAMS & set(params)}
    if runtime.card is not None and runtime.card.strategy == name:
        common = {**card_templates(runtime.card, runtime.tokenizer), **common}
    return cls(runtime, cls.Options.given(params, name), **common)


def card_templates(card: EmbeddingCard, tokenizer: Any) -> dict[str, str]:
    """The templates an embedding model's card asks for: its prompts, and for last-token pooling
    the end-of-text token it was trained to be read at, where its tokenizer does not append it
    (a GGUF file without ``add_eos_token``, as Qwen's first Qwen3-Embedding files were)."""
    ends_itself = tokenizer("a")["input_ids"][-1:] == [tokenizer.eos_token_id]
    final = tokenizer.eos_token if card.strategy == "last" and tokenizer.eos_token and not ends_itself else ""
    return {
        "document_template": card.document_prompt + TEXT_SLOT + final,
        "query_template": card.query_prompt + TEXT_SLOT + final,
    }
