"""What a user can choose: the packaged models, the strategies and their options, the search
options, the devices, precisions, vector index types and vector stores. The CLI's menus and help
come from here, and Python users can list the same."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragidx.app.answering import DEFAULT_NEW_TOKENS, problems
from ragidx.app.lazy_names import lazy_names
from ragidx.indexer.ingest.access import DEFAULT_MAX_FILE_BYTES
from ragidx.indexer.model.batch_size import CPU_ROWS, CPU_TOKENS, GPU_MAX_TOKENS, ROW_TOKENS
from ragidx.indexer.model.choices import DEFAULT_DECODER, DEFAULT_MODEL, DEVICES, DTYPES
from ragidx.indexer.roles import ROLES
from ragidx.indexer.search.context import DEFAULT_MAX_TOKENS as DEFAULT_CONTEXT_TOKENS
from ragidx.indexer.search.context import nothing_fits
from ragidx.indexer.search.fusion import METHODS
from ragidx.indexer.search.options import MAX_K, MODES, SEARCH_OPTION_SPECS, SearchOptionSpec
from ragidx.indexer.storage.filters import FILTER_HELP, FILTER_KINDS, parse_meta
from ragidx.indexer.storage.index_settings import FLAT_SCAN_BYTES, INDEX_TYPES, VectorIndexSettings
from ragidx.indexer.storage.stores import STORES

if TYPE_CHECKING:
    from ragidx.indexer.build.tuning import DEFAULT_PSEUDO_QUERIES
    from ragidx.indexer.ingest.chunking import DEFAULT_OVERLAP_SENTENCES
    from ragidx.indexer.model.sources import install_packaged_model, ollama_model_rows, packaged_model_rows
    from ragidx.indexer.strategies import OPTION_SPECS, strategy_rows
    from ragidx.indexer.strategies.options import OptionSpec, flag_of

VECTOR_INDEX = VectorIndexSettings()  # the vector index settings a build takes by default

__all__ = [
    "CPU_ROWS",
    "CPU_TOKENS",
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_DECODER",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MODEL",
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_OVERLAP_SENTENCES",
    "DEFAULT_PSEUDO_QUERIES",
    "DEVICES",
    "DTYPES",
    "FILTER_HELP",
    "FILTER_KINDS",
    "FLAT_SCAN_BYTES",
    "GPU_MAX_TOKENS",
    "INDEX_TYPES",
    "MAX_K",
    "METHODS",
    "MODES",
    "OPTION_SPECS",
    "ROLES",
    "ROW_TOKENS",
    "SEARCH_OPTION_SPECS",
    "STORES",
    "VECTOR_INDEX",
    "OptionSpec",
    "SearchOptionSpec",
    "flag_of",
    "install_packaged_model",
    "nothing_fits",
    "ollama_model_rows",
    "packaged_model_rows",
    "parse_meta",
    "problems",
    "strategy_rows",
]


# The strategies and the model sources import much more: these wait until first used, so a
# command that names none of them (a query through the daemon) starts without them.
__getattr__ = lazy_names(
    __name__,
    {
        "OPTION_SPECS": "ragidx.indexer.strategies",
        "OptionSpec": "ragidx.indexer.strategies.options",
        "flag_of": "ragidx.indexer.strategies.options",
        "install_packaged_model": "ragidx.indexer.model.sources",
        "ollama_model_rows": "ragidx.indexer.model.sources",
        "packaged_model_rows": "ragidx.indexer.model.sources",
        "strategy_rows": "ragidx.indexer.strategies",
        "strategy_defaults": "ragidx.indexer.strategies",
        "DEFAULT_OVERLAP_SENTENCES": "ragidx.indexer.ingest.chunking",
        "DEFAULT_PSEUDO_QUERIES": "ragidx.indexer.build.tuning",
    },
)
