"""What a caller may send, as pydantic types shared by the HTTP API and the MCP server: bounded
sizes, finite numbers, strict types (``true`` is not a number, ``"10"`` not an integer), text that
is valid Unicode. Errors name the field, never echo the value.

The search request is generated from the search options' one declaration
(:data:`~ragidx.app.catalog.SEARCH_OPTION_SPECS`): a new option appears here, in the HTTP schema
and in the MCP tool without being written again.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from ragidx.app.answering import DEFAULT_NEW_TOKENS
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.roles import Role
from ragidx.indexer.search.context import DEFAULT_MAX_TOKENS as DEFAULT_CONTEXT_TOKENS
from ragidx.indexer.search.options import (
    MAX_OPTION_TEXT,
    SEARCH_OPTION_SPECS,
    SEARCH_SPECS_BY_NAME,
    SearchOptionSpec,
)
from ragidx.indexer.storage.filters import FILTER_KINDS, parse_meta
from ragidx.indexer.wording import encodable, excerpt

MAX_TEXT_CHARS = 20_000
MAX_EMBED_TEXTS = 2048  # texts in one embedding request, /embed's and /v1/embeddings' (OpenAI's own limit)
MAX_WEIGHT = 1e6  # only the ratio of the weights matters
MAX_CONTEXT_TOKENS = 1_000_000


def _valid_unicode(text: str) -> str:
    """JSON can carry lone surrogates (``"\\ud800"``); no index can store or search them."""
    if not encodable(text):
        raise ValueError("text is not valid Unicode (a lone surrogate)")
    return text


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


Text = Annotated[str, AfterValidator(_valid_unicode)]
Alternatives = Annotated[list[Text], BeforeValidator(_as_list)]  # one string, or a list of them
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Whole = Annotated[int, Field(strict=True)]
MetaValue = Text | Whole | Number | bool | list[Text | Whole | Number | bool]
Query = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TEXT_CHARS, description="What to look for."),
    AfterValidator(_valid_unicode),
]


class FilterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Alternatives | None = None
    ext: Alternatives | None = None
    meta: dict[Text, MetaValue] | None = None


class WeightsBody(BaseModel):
    """Hybrid fusion weights; a list left out weighs 0."""

    model_config = ConfigDict(extra="forbid")

    dense: float = Field(default=0.0, ge=0, le=MAX_WEIGHT, allow_inf_nan=False, strict=True)
    lexical: float = Field(default=0.0, ge=0, le=MAX_WEIGHT, allow_inf_nan=False, strict=True)


COMPOSITE_BODIES: dict[str, type[BaseModel]] = {"filters": FilterBody, "weights": WeightsBody}


SHOWN_CHARS = 40  # of a field name in an error


def _shown(part: str | int) -> str | int:
    """A field name or list index from an error's location, short and encodable."""
    if isinstance(part, int):
        return part
    text = str(part).encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def validation_detail(found: Sequence[Any]) -> tuple[str, list[dict[str, Any]]]:
    """pydantic's errors as one line naming where and what (``k: Input should be ...``) and a
    list without the input values (they may be huge, or not encodable: NaN, lone surrogates)."""
    errors = [{"loc": [_shown(part) for part in e["loc"]], "type": e["type"], "msg": e["msg"]} for e in found]
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"] if part != "body")
    return (f"{where}: {first['msg']}" if where else first["msg"]), errors


def option_annotation(spec: SearchOptionSpec) -> Any:
    """A search option's type as a request carries it, with its bounds, default and help."""
    scalar: Any = {
        "int": Whole,
        "float": Number,
        "bool": Annotated[bool, Field(strict=True)],
        "choice": Literal[spec.choices] if spec.choices else None,
        "text": Annotated[str, Field(strict=True, min_length=1, max_length=MAX_OPTION_TEXT)],
    }.get(spec.kind) or COMPOSITE_BODIES[spec.kind]
    optional = spec.optional or spec.kind in COMPOSITE_BODIES
    field = Field(ge=spec.minimum, le=spec.maximum, description=spec.help)
    return Annotated[scalar | None if optional else scalar, field]


def search_parameters() -> list[inspect.Parameter]:
    """The search request's fields as keyword parameters (the MCP tool's signature)."""
    query = inspect.Parameter("query", inspect.Parameter.KEYWORD_ONLY, annotation=Query)
    return [query] + [
        inspect.Parameter(
            spec.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=spec.default,
            annotation=option_annotation(spec),
        )
        for spec in SEARCH_OPTION_SPECS
    ]


def search_options(body: BaseModel | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The query and the search options of a request, as ``Index.search`` takes them."""
    values = body.model_dump(exclude_none=True) if isinstance(body, BaseModel) else dict(body)
    given = {
        name: value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value
        for name, value in values.items()
        if value is not None
    }
    return str(given.pop("query")), given


MaxTokens = Annotated[
    int,
    Field(
        strict=True,
        ge=1,
        le=MAX_CONTEXT_TOKENS,
        description="The most tokens the context may take (the index's model's tokenizer).",
    ),
]

MAX_NEW_TOKENS = 4096
NewTokens = Annotated[
    int, Field(strict=True, ge=1, le=MAX_NEW_TOKENS, description="The longest answer, in tokens.")
]

if TYPE_CHECKING:
    SearchBody = BaseModel
    ContextBody = BaseModel
    AskBody = BaseModel
else:
    SearchBody = create_model(
        "SearchBody",
        __config__=ConfigDict(extra="forbid"),
        **{
            p.name: (p.annotation, ... if p.default is inspect.Parameter.empty else p.default)
            for p in search_parameters()
        },
    )
    ContextBody = create_model(
        "ContextBody", __base__=SearchBody, max_tokens=(MaxTokens, DEFAULT_CONTEXT_TOKENS)
    )
    AskBody = create_model(
        "AskBody",
        __base__=ContextBody,
        max_new_tokens=(NewTokens, DEFAULT_NEW_TOKENS),
        closed_book=(Annotated[bool, Field(strict=True)], False),
        stream=(Annotated[bool, Field(strict=True)], True),
    )


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def query_parameters(
    params: Mapping[str, str] | Any, context: bool = False
) -> tuple[str, dict[str, Any], int]:
    """A GET request's query, search options and context budget from its URL's parameters: ``q``,
    each option by name (``k=3``, ``mode=dense``, ``weights=dense=0.3,lexical=0.7``), filters as
    repeatable ``path=``, ``ext=`` and ``meta=KEY=VALUE``, and with ``context`` ``max_tokens``."""
    given: dict[str, Any] = {}
    filters: dict[str, Any] = {}
    max_tokens = DEFAULT_CONTEXT_TOKENS
    allowed = {"q", *SEARCH_SPECS_BY_NAME, *FILTER_KINDS} | ({"max_tokens"} if context else set())
    for name in params:
        if name not in allowed:
            raise RagidxError(f"unknown parameter {excerpt(name)}")
    query = params.get("q", "")
    if not query.strip() or len(query) > MAX_TEXT_CHARS:
        raise RagidxError(f"q: give the query (1 to {MAX_TEXT_CHARS} characters)")
    for kind in FILTER_KINDS:
        values = params.getlist(kind) if hasattr(params, "getlist") else [params[kind]] * (kind in params)
        if values:
            filters[kind] = parse_meta(values, "meta=") if kind == "meta" else values
    if filters:
        given["filters"] = filters
    for name, spec in SEARCH_SPECS_BY_NAME.items():
        if name in params and spec.kind != "filters":
            given[name] = _typed(name, spec.kind, params[name])
    if "max_tokens" in params:
        max_tokens = _typed("max_tokens", "int", params["max_tokens"])
        if not 1 <= max_tokens <= MAX_CONTEXT_TOKENS:
            raise RagidxError(f"max_tokens must be 1 to {MAX_CONTEXT_TOKENS}, got {max_tokens}")
    return query, given, max_tokens


def _typed(name: str, kind: str, value: str) -> Any:
    """A parameter's text as its option's type (the option then checks its bounds)."""
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise RagidxError(
            f"{name} needs a {'whole ' if kind == 'int' else ''}number, got {excerpt(value)}"
        ) from None
    if kind == "bool":
        if value.lower() not in TRUE + FALSE:
            raise RagidxError(f"{name} is true or false, got {excerpt(value)}")
        return value.lower() in TRUE
    return value


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    texts: list[Annotated[Text, Field(max_length=MAX_TEXT_CHARS)]] = Field(
        min_length=1, max_length=MAX_EMBED_TEXTS
    )
    role: Role = "query"
