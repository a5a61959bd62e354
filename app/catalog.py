"""What a user can choose: the packaged models, the strategies and their options, the devices,
precisions and vector stores. The CLI's menus and help come from here, and Python users can list the same."""

from __future__ import annotations

from typing import Any

from ragidx.indexer.models import install_packaged_model, packaged_model_rows
from ragidx.indexer.runtime import DEFAULT_MODEL, DEVICES, DTYPES, default_model
from ragidx.indexer.settings import STORES, describe_store
from ragidx.indexer.strategies import OPTION_SPECS, REGISTRY
from ragidx.indexer.strategies.options import OptionSpec, flag_of

__all__ = [
    "DEFAULT_MODEL",
    "DEVICES",
    "DTYPES",
    "OPTION_SPECS",
    "STORES",
    "OptionSpec",
    "default_model",
    "describe_store",
    "flag_of",
    "install_packaged_model",
    "packaged_model_rows",
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
