"""`ragidx mcp` end to end: the MCP SDK's own stdio client starts the server as a subprocess,
lists and calls its tools, reads its resources, and gets tool errors (not a crash) for bad
arguments. Expected answers come from the Python API in the test's own process and from
re-reading files."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from ragidx.app import Index
from ragidx.indexer.ingest.sources import read_document
from tests.support.cli import ragidx
from tests.support.documents import KELP, LAGOONS, TIDES, write_pdf
from tests.support.mcp_client import session

mcp = pytest.importorskip("mcp")


@pytest.fixture(scope="module")
def mcp_corpus(tmp_path_factory, sample_corpus) -> Path:
    corpus = tmp_path_factory.mktemp("mcp-corpus")
    for path in sorted(sample_corpus.rglob("*.md"))[:4]:
        (corpus / path.name).write_text(path.read_text())
    write_pdf(corpus / "tides.pdf", [[TIDES, LAGOONS], [KELP]])
    (corpus / "changing.md").write_text("# Changing\n\nThis note is edited after it is indexed.\n")
    return corpus


@pytest.fixture(scope="module")
def mcp_index(tmp_path_factory, tiny_models, mcp_corpus) -> Path:
    index = tmp_path_factory.mktemp("mcp") / "index"
    ragidx("build", mcp_corpus, "--model", tiny_models["qwen2"], "--index", index, "--chunk-tokens", "32")
    return index


def structured(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def test_tools_answer_as_the_python_api_does(mcp_index):
    query = "kelp forests cold water"

    async def script(client) -> dict:
        tools = await client.list_tools()
        found = structured(
            await client.call_tool("search", {"query": query, "k": 3, "mode": "lexical", "explain": True})
        )
        hit = found["hits"][0]
        span = {"path": hit["path"], "start": hit["span"][0], "end": hit["span"][1]}
        return {
            "tools": {tool.name: tool for tool in tools.tools},
            "found": found,
            "slice": structured(await client.call_tool("get_document", span)),
            "whole": structured(await client.call_tool("get_document", {"path": hit["path"]})),
            "status": structured(await client.call_tool("status", {})),
            "context": structured(await client.call_tool("context", {"query": query, "max_tokens": 120})),
        }

    got = session(mcp_index, script)
    assert set(got["tools"]) == {"search", "context", "get_document", "status"}
    assert got["tools"]["search"].annotations.read_only_hint
    with Index.open(mcp_index) as opened:  # the same search through the Python API, in this process
        expected = opened.search(query, k=3, mode="lexical", explain=True)
        info = opened.info()
        assert got["context"] == opened.context(query, max_tokens=120).to_dict()
    hits = got["found"]["hits"]
    assert [(h["path"], h["span"], h["score"]) for h in hits] == [
        (h.path, list(h.span), pytest.approx(h.score)) for h in expected
    ]
    assert [h["explain"] for h in hits] == [h.to_dict()["explain"] for h in expected]
    top = hits[0]
    assert Path(top["path"]).name == "tides.pdf" and top["page"] == 2 and KELP in top["text"]
    assert got["slice"]["text"] == top["text"] and got["slice"]["pages"] == [2]
    assert got["whole"]["text"] == read_document(Path(top["path"])).text
    assert got["whole"]["metadata"]["author"] == "A. Writer" and got["whole"]["next_start"] is None
    assert not got["whole"]["changed_since_indexed"]
    status = got["status"]
    assert (status["generation"], status["documents"], status["chunks"]) == (
        info["generation"],
        info["documents"],
        info["chunks"],
    )


def test_every_tool_uses_the_model_on_the_schedulers_thread(mcp_index, index_threads):
    """Tools run on the SDK's worker threads; every use of the model (the searches' embeddings,
    its load) runs on the server's scheduler's one thread, and the rest never waits for it."""
    from ragidx.app.mcp.server import create_server

    used = index_threads("embed")

    async def calls(server) -> list:
        return [
            await server.call_tool("search", {"query": "kelp forests", "k": 2}),
            await server.call_tool("context", {"query": "kelp forests", "max_tokens": 60}),
            await server.call_tool("status", {}),
            await server.list_resources(),
        ]

    with Index.open(mcp_index) as index:
        server = create_server(index)
        server.load_model()
        answers = asyncio.run(calls(server))
        with server.scheduler.job("test", "thread") as job:
            model = server.scheduler.run(job, threading.get_ident)
    assert all(answers) and used["embed"] == {model}, used


def test_documents_are_resources(mcp_index):
    async def script(client) -> dict:
        listed = (await client.list_resources()).resources
        pdf = next(r for r in listed if r.name.endswith("tides.pdf"))
        read = await client.read_resource(pdf.uri)
        return {"listed": listed, "pdf": pdf, "text": read.contents[0].text}

    got = session(mcp_index, script)
    assert len(got["listed"]) == 6 and all(str(r.uri).startswith("file:///") for r in got["listed"])
    assert got["pdf"].title == "Tidal Notes"
    assert got["text"] == read_document(Path(got["pdf"].name)).text


def test_a_document_edited_since_indexing_is_flagged(mcp_index, mcp_corpus):
    changing = mcp_corpus / "changing.md"
    path = str(changing)
    changing.write_text("# Changing\n\nEdited.\n")

    async def script(client) -> dict:
        return structured(await client.call_tool("get_document", {"path": path}))

    got = session(mcp_index, script)
    assert got["changed_since_indexed"] and got["text"] == "# Changing\n\nEdited.\n"


def test_bad_arguments_are_tool_errors_and_the_server_keeps_answering(mcp_index):
    calls = [
        ("search", {"query": "tides", "k": 0}),
        ("search", {"query": "tides", "mode": "fuzzy"}),
        ("search", {"query": ""}),
        ("search", {"query": "tides", "filters": {"meta": {"bad key!": "x"}}}),
        ("get_document", {"path": "/etc/passwd"}),
        ("get_document", {"path": "/etc/passwd", "start": -1}),
    ]

    async def script(client) -> dict:
        errors = []
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            errors.append((result.is_error, result.content[0].text))
        after = structured(await client.call_tool("search", {"query": "tides", "mode": "lexical", "k": 1}))
        return {"errors": errors, "after": after}

    got = session(mcp_index, script)
    assert all(is_error for is_error, _ in got["errors"]), got["errors"]
    messages = [text for _, text in got["errors"]]
    assert "k" in messages[0] and "mode" in messages[1] and "query" in messages[2]
    assert "metadata key" in messages[3]
    assert "not an indexed document: /etc/passwd" in messages[4]
    assert "start" in messages[5] and "root:" not in " ".join(messages)
    assert len(got["after"]["hits"]) == 1
