"""Retrieval over a built index: the public Python API.

``Index``, ``Embedder``, ``Hit``, ``SearchOptions``, ``BuildOptions`` and ``Role`` are imported on
first use, so ``import ragidx.app`` (and the CLI, which answers many commands through a daemon
without any model) stays cheap.
"""

from __future__ import annotations

from ragidx.app.lazy_names import lazy_names
from ragidx.indexer.errors import RagidxError

# typing's constant without importing typing: every `ragidx query` imports this package (the
# console script lives in it), and typing costs it ~7 ms (a wheel install, `python -X importtime`)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ragidx.app.embedder import Embedder
    from ragidx.app.retriever import Index, SearchOptions
    from ragidx.indexer.build.settings import BuildOptions
    from ragidx.indexer.roles import Role
    from ragidx.indexer.search.hits import Hit, hit_from_dict
    from ragidx.indexer.storage.location import default_index_dir

__all__ = [
    "BuildOptions",
    "Embedder",
    "Hit",
    "Index",
    "RagidxError",
    "Role",
    "SearchOptions",
    "default_index_dir",
    "hit_from_dict",
]
_HOMES = {
    "BuildOptions": "ragidx.indexer.build.settings",
    "Embedder": "ragidx.app.embedder",
    "Hit": "ragidx.indexer.search.hits",
    "Index": "ragidx.app.retriever",
    "SearchOptions": "ragidx.indexer.search.options",
    "Role": "ragidx.indexer.roles",
    "default_index_dir": "ragidx.indexer.storage.location",
    "hit_from_dict": "ragidx.indexer.search.hits",
}

__getattr__ = lazy_names(__name__, _HOMES)
