"""ragidx in LlamaIndex (``pip install 'ragidx[llama-index]'``): a retriever over an index and an
embedding model that embeds documents and queries each in its own role.

    retriever = RagidxRetriever("my-index", k=5)
    engine = RetrieverQueryEngine.from_args(retriever, llm=your_llm)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import PrivateAttr

from ragidx.app.integrations.common import SEARCH_OPTION_NAMES, Guarded, hit_metadata
from ragidx.app.retriever import Hit, Index, SearchOptions


class RagidxRetriever(BaseRetriever):
    """The index's best chunks for a query as ``NodeWithScore`` (a ``TextNode`` with the chunk's
    text, its metadata as in the LangChain retriever, and the hit's score). Search options are
    ragidx's (:class:`SearchOptions`)."""

    def __init__(
        self, index: Guarded | Index | str | Path, options: SearchOptions | None = None, **given: Any
    ):
        """``index``: an index (open, or its folder); ``given``: search options (``k=5``) and
        LlamaIndex's own (``callback_manager``, ``verbose``)."""
        searching = {name: given.pop(name) for name in list(given) if name in SEARCH_OPTION_NAMES}
        self.source = index if isinstance(index, Guarded) else Guarded.of(index, None)
        self.options = SearchOptions.of(options, **searching)
        super().__init__(**given)

    @classmethod
    def from_index(cls, index: Index | str | Path, **options: Any) -> RagidxRetriever:
        """A retriever over ``index`` (open, or its folder) with these search options."""
        return cls(Guarded.of(index, None), SearchOptions.of(**options))

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return nodes(self.source.search(query_bundle.query_str, self.options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return nodes(await self.source.asearch(query_bundle.query_str, self.options))


def nodes(hits: list[Hit]) -> list[NodeWithScore]:
    return [
        NodeWithScore(
            node=TextNode(
                id_=f"ragidx-{hit.chunk_id}",
                text=hit.text,
                metadata=hit_metadata(hit),
                excluded_embed_metadata_keys=["span", "chunk_id", "score", "rank"],
                excluded_llm_metadata_keys=["span", "chunk_id", "score", "rank"],
            ),
            score=hit.score,
        )
        for hit in hits
    ]


class RagidxEmbedding(BaseEmbedding):
    """Vectors as a ragidx index stores (texts) and searches with (queries): an index's own model
    and strategy, or a model and strategy without an index."""

    _source: Guarded = PrivateAttr()

    def __init__(self, index: Index | str | Path | None = None, *, model: str | None = None, **options: Any):
        source = Guarded.of(index, model, **options)
        name = source.source.settings.model if isinstance(source.source, Index) else source.source.model
        super().__init__(model_name=name)
        self._source = source

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._source.embed([query], "query")[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._source.aembed([query], "query"))[0].tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._source.embed([text], "document")[0].tolist()

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._source.aembed([text], "document"))[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._source.embed(texts, "document").tolist()

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return (await self._source.aembed(texts, "document")).tolist()
