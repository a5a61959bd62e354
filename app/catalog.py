"""What a user can choose: the packaged models, the strategies and their options, the search
options, the devices, precisions, vector index types and vector stores. The CLI's menus and help
come from here, and Python users can list the same."""

from __future__ import annotations

from typing import Any

from ragidx.app.answering import DEFAULT_NEW_TOKENS, flagged
from ragidx.indexer.model.runtime import DEFAULT_MODEL, DEVICES, DTYPES, default_model
from ragidx.indexer.model.sources import install_packaged_model, ollama_model_rows, packaged_model_rows
from ragidx.indexer.search.context import DEFAULT_MAX_TOKENS as DEFAULT_CONTEXT_TOKENS
from ragidx.indexer.search.fusion import METHODS
from ragidx.indexer.search.options import MAX_K, MODES, SEARCH_OPTION_SPECS, SearchOptionSpec
from ragidx.indexer.storage.filters import FILTER_HELP, FILTER_KINDS, parse_meta
from ragidx.indexer.storage.index_settings import INDEX_TYPES
from ragidx.indexer.storage.stores import STORES
from ragidx.indexer.strategies import OPTION_SPECS, REGISTRY
from ragidx.indexer.strategies.base import ROLES
from ragidx.indexer.strategies.options import OptionSpec, flag_of

__all__ = [
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_MODEL",
    "DEFAULT_NEW_TOKENS",
    "DEVICES",
    "DTYPES",
    "FILTER_HELP",
    "FILTER_KINDS",
    "INDEX_TYPES",
    "MAX_K",
    "METHODS",
    "MODES",
    "OPTION_SPECS",
    "ROLES",
    "SEARCH_OPTION_SPECS",
    "STORES",
    "OptionSpec",
    "SearchOptionSpec",
    "default_model",
    "flag_of",
    "flagged",
    "install_packaged_model",
    "ollama_model_rows",
    "packaged_model_rows",
    "parse_meta",
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
