"""What a caller may send, as pydantic types shared by the HTTP API and the MCP server: bounded
sizes, finite numbers, text that is valid Unicode. Errors name the field, never echo the value."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ragidx.indexer.wording import encodable

MAX_K = 1000
MAX_TEXT_CHARS = 20_000
MAX_EMBED_TEXTS = 256
MAX_WEIGHT = 1e6  # only the ratio of the weights matters
MAX_SEARCH_BREADTH = 65_536  # efSearch / nprobe: beyond this a request is a denial of service, not tuning


def _valid_unicode(text: str) -> str:
    """JSON can carry lone surrogates (``"\\ud800"``); no index can store or search them."""
    if not encodable(text):
        raise ValueError("text is not valid Unicode (a lone surrogate)")
    return text


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


Text = Annotated[str, AfterValidator(_valid_unicode)]
Alternatives = Annotated[list[Text], BeforeValidator(_as_list)]  # one string, or a list of them
Number = Annotated[float, Field(allow_inf_nan=False)]
MetaValue = Text | int | Number | bool | list[Text | int | Number | bool]


class FilterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Alternatives | None = None
    ext: Alternatives | None = None
    meta: dict[Text, MetaValue] | None = None


class WeightsBody(BaseModel):
    """Hybrid fusion weights; a list left out weighs 0."""

    model_config = ConfigDict(extra="forbid")

    dense: float = Field(default=0.0, ge=0, le=MAX_WEIGHT, allow_inf_nan=False)
    lexical: float = Field(default=0.0, ge=0, le=MAX_WEIGHT, allow_inf_nan=False)


class SearchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: Text = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    k: int = Field(default=10, ge=1, le=MAX_K)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    filters: FilterBody | None = None
    min_score: Number | None = None
    weights: WeightsBody | None = None
    fusion: Literal["rrf", "minmax"] | None = None
    ef_search: int | None = Field(default=None, ge=1, le=MAX_SEARCH_BREADTH)
    nprobe: int | None = Field(default=None, ge=1, le=MAX_SEARCH_BREADTH)


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    texts: list[Annotated[Text, Field(max_length=MAX_TEXT_CHARS)]] = Field(
        min_length=1, max_length=MAX_EMBED_TEXTS
    )
    role: Literal["query", "document"] = "query"
