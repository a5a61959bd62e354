"""One declaration of the search options: the CLI's query flags, the HTTP request schema, the MCP
search tool and the Python API are all derived from SearchOptions, and each door checks a value
the same way."""

from __future__ import annotations

import asyncio

import pytest

from ragidx.app import SearchOptions
from ragidx.app.catalog import FILTER_KINDS, SEARCH_OPTION_SPECS
from ragidx.app.mcp.server import create_server
from ragidx.app.service.schemas import SearchBody
from ragidx.cli import query
from ragidx.indexer.errors import RagidxError

NAMES = [spec.name for spec in SEARCH_OPTION_SPECS]


def test_every_field_of_search_options_is_a_spec():
    assert [name for name in SearchOptions.__dataclass_fields__] == NAMES
    assert {"k", "mode", "filters", "weights", "fusion", "explain"} <= set(NAMES)


def test_the_cli_has_one_flag_per_option():
    flags = {option for param in query.params for option in param.opts}
    for spec in SEARCH_OPTION_SPECS:
        wanted = [f"--{kind}" for kind in FILTER_KINDS] if spec.kind == "filters" else list(spec.cli_flags)
        assert set(wanted) <= flags, spec.name
    defaults = {param.name: param.default for param in query.params}
    for spec in SEARCH_OPTION_SPECS:
        if spec.kind not in ("filters", "bool"):
            assert defaults[spec.name] == spec.default, spec.name


def test_the_http_schema_and_the_mcp_tool_take_the_same_options():
    properties = SearchBody.model_json_schema()["properties"]
    assert list(properties) == ["query", *NAMES]
    for spec in SEARCH_OPTION_SPECS:
        assert properties[spec.name]["description"] == spec.help
        assert properties[spec.name].get("default") == spec.default
    tools = {tool.name: tool for tool in asyncio.run(create_server(object()).list_tools())}  # type: ignore[arg-type]
    schema = tools["search"].input_schema
    assert list(schema["properties"]) == ["query", *NAMES] and schema["required"] == ["query"]
    for name in NAMES:
        assert schema["properties"][name]["description"] == properties[name]["description"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"k": 0}, "k must be at least 1, got 0"),
        ({"k": 1001}, "k must be at most 1000"),
        ({"k": True}, "k needs a whole number"),
        ({"k": "10"}, "k needs a whole number"),
        ({"mode": "sparse"}, "unknown mode 'sparse'"),
        ({"min_score": float("inf")}, "min_score needs a finite number"),
        ({"ef_search": 0}, "ef_search must be at least 1"),
        ({"explain": "yes"}, "explain is true or false"),
        ({"weights": "dense=x"}, "weight of dense is not a number"),
        ({"mode": "dense", "fusion": "rrf"}, "weights and fusion apply to hybrid search, not to dense"),
        ({"filters": {"colour": "red"}}, "unknown filter 'colour'"),
        ({"rerun": True}, "unknown search option 'rerun'"),
        ({"rerank": 3}, "rerank needs 1 to 4096 characters of text, got 3"),
        ({"rerank": "  "}, "rerank needs 1 to 4096 characters of text"),
    ],
)
def test_each_value_is_checked_against_its_declaration(given, message):
    with pytest.raises(RagidxError, match=message):
        SearchOptions.of(**given)


def test_options_merge_and_normalise():
    base = SearchOptions.of(k=3, weights="dense=1,lexical=3")
    merged = SearchOptions.of(base, fusion="minmax", filters={"ext": "MD"})
    assert (merged.k, merged.fusion, merged.filters.exts) == (3, "minmax", ("md",))
    assert (merged.weights.dense, merged.weights.lexical) == (1.0, 3.0)
    assert merged.candidates == 100 and SearchOptions.of(k=80).candidates == 160
    assert SearchOptions.of(mode="dense", k=7).candidates == 7
