"""ragidx in LangChain (``pip install 'ragidx[langchain]'``): a retriever over an index and an
embeddings class that embeds documents and queries each in its own role.

    retriever = RagidxRetriever.from_index("my-index", k=5, mode="hybrid", filters={"path": "docs/*"})
    chain = retriever | format_docs | prompt | llm
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from ragidx.app.integrations.common import Guarded, hit_metadata
from ragidx.app.retriever import Hit, Index, SearchOptions


class RagidxRetriever(BaseRetriever):
    """The index's best chunks for a query as ``Document``s (text, and metadata: path, span,
    page, title, chunk id, score, rank, and the document's own metadata). Search options are
    ragidx's (:class:`SearchOptions`: ``k``, ``mode``, ``filters``, ``weights``...), given once
    or per call: ``retriever.invoke(query, k=3)``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: Guarded
    options: SearchOptions = SearchOptions()

    @classmethod
    def from_index(cls, index: Index | str | Path, **options: Any) -> RagidxRetriever:
        """A retriever over ``index`` (open, or its folder) with these search options."""
        return cls(source=Guarded.of(index, None), options=SearchOptions.of(**options))

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **options: Any
    ) -> list[Document]:
        return documents(self.source.search(query, SearchOptions.of(self.options, **options)))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **options: Any
    ) -> list[Document]:
        return documents(await self.source.asearch(query, SearchOptions.of(self.options, **options)))


def documents(hits: list[Hit]) -> list[Document]:
    return [Document(page_content=hit.text, metadata=hit_metadata(hit)) for hit in hits]


class RagidxEmbeddings(Embeddings):
    """Vectors as a ragidx index stores (``embed_documents``) and searches with (``embed_query``):
    an index's own model and strategy, or a model and strategy without an index."""

    def __init__(self, index: Index | str | Path | None = None, *, model: str | None = None, **options: Any):
        self.source = Guarded.of(index, model, **options)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.source.embed(texts, "document").tolist() if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self.source.embed([text], "query")[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return (await self.source.aembed(texts, "document")).tolist() if texts else []

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.source.aembed([text], "query"))[0].tolist()
