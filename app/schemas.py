"""What a caller may send, as pydantic types shared by the HTTP API and the MCP server: bounded
sizes, finite numbers, strict types (``true`` is not a number, ``"10"`` not an integer), text that
is valid Unicode. Errors name the field, never echo the value.

The search request is generated from the search options' one declaration
(:data:`~ragidx.app.catalog.SEARCH_OPTION_SPECS`): a new option appears here, in the HTTP schema
and in the MCP tool without being written again.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from ragidx.indexer.search.options import SEARCH_OPTION_SPECS, SearchOptionSpec
from ragidx.indexer.strategies.base import Role
from ragidx.indexer.wording import encodable

MAX_TEXT_CHARS = 20_000
MAX_EMBED_TEXTS = 256
MAX_WEIGHT = 1e6  # only the ratio of the weights matters


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


if TYPE_CHECKING:
    SearchBody = BaseModel
else:
    SearchBody = create_model(
        "SearchBody",
        __config__=ConfigDict(extra="forbid"),
        **{
            p.name: (p.annotation, ... if p.default is inspect.Parameter.empty else p.default)
            for p in search_parameters()
        },
    )


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    texts: list[Annotated[Text, Field(max_length=MAX_TEXT_CHARS)]] = Field(
        min_length=1, max_length=MAX_EMBED_TEXTS
    )
    role: Role = "query"
