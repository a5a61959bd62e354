"""ragidx in LangChain (``pip install 'ragidx[langchain]'``): a retriever over an index and an
embeddings class that embeds documents and queries each in its own role.

    retriever = RagidxRetriever(index="my-index", k=5, mode="hybrid", filters={"path": "docs/*"})
    chain = retriever | format_docs | prompt | llm
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, model_validator

from ragidx.app.integrations.common import SEARCH_OPTION_NAMES, Guarded, hit_metadata
from ragidx.app.retriever import Hit, Index, SearchOptions


class RagidxRetriever(BaseRetriever):
    """The index's best chunks for a query as ``Document``s (text, and metadata: path, span,
    page, title, chunk id, score, rank, and the document's own metadata). Search options are
    ragidx's (:class:`SearchOptions`: ``k``, ``mode``, ``filters``, ``weights``...), given once
    or per call: ``retriever.invoke(query, k=3)``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: Guarded
    options: SearchOptions = SearchOptions()

    @model_validator(mode="before")
    @classmethod
    def _from_index(cls, given: Any) -> Any:
        """``RagidxRetriever(index="my-index", k=5)``, as the embeddings class takes it: the
        index (open, or its folder) and search options, in place of the internal fields."""
        if isinstance(given, dict) and "index" in given:
            given = dict(given)
            index = given.pop("index")
            options = {name: given.pop(name) for name in list(given) if name in SEARCH_OPTION_NAMES}
            given.update(source=Guarded.of(index, None), options=SearchOptions.of(**options))
        return given

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
