"""One scheduler for model work: slices taken client by client, batches of waiting queries, a
bounded queue, cancellation, background work last; and what it buys the daemon, ``serve`` and the
CLI: keyword searches that never wait for the model, a chat endpoint read with no model held and
closed when its client leaves, one daemon per socket whatever happens to it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ragidx.app import Index
from ragidx.app.service.scheduler import Busy, Scheduler
from ragidx.app.service.served_index import ServedIndex
from ragidx.indexer.errors import Cancelled
from tests.support.chat_server import FakeChat
from tests.support.cli import RAGIDX, child_env, ragidx
from tests.support.daemon import alive, sockets

QUESTION = "How do I return a bicycle?"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@contextlib.contextmanager
def held(scheduler: Scheduler):
    """The model thread kept busy by one slice until the block ends (what a long forward does)."""
    release, running = threading.Event(), threading.Event()

    def block() -> None:
        running.set()
        release.wait(30)

    def hold() -> None:
        with scheduler.job("holder", "block") as job:
            scheduler.run(job, block)

    holder = threading.Thread(target=hold)
    holder.start()
    running.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join()


def in_thread(work) -> tuple[threading.Thread, list]:
    found: list = []

    def run() -> None:
        try:
            found.append(work())
        except BaseException as error:
            found.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, found


def test_a_query_waits_at_most_one_slice_behind_long_jobs_which_share_the_model():
    """Three clients' long jobs and a fourth's queries: each query runs right after the slice then
    running (clients taken in turn, it waited behind the other two long jobs' slices too), and
    the long jobs take turns."""
    scheduler = Scheduler()
    ran: list[tuple[str, int]] = []
    names = ("long-a", "long-b", "long-c")
    started = threading.Barrier(len(names) + 1)

    def long_job(name: str) -> None:
        with scheduler.job(name, "embed") as job:
            started.wait(10)
            for number in range(30):
                scheduler.run(job, lambda n=number: (ran.append((name, n)), time.sleep(0.05)))

    workers = [threading.Thread(target=long_job, args=(name,)) for name in names]
    for worker in workers:
        worker.start()
    started.wait(10)
    time.sleep(0.1)
    for _ in range(5):
        before = len(ran)
        with scheduler.job("query", "search") as job:
            scheduler.run(job, lambda: ran.append(("query", 0)))
        position = max(i for i, (who, _) in enumerate(ran) if who == "query")
        assert position <= before + 1, ran  # at most the long slice then running came first
        time.sleep(0.05)
    for worker in workers:
        worker.join()
    for name in names:
        assert [n for who, n in ran if who == name] == list(range(30))  # nothing lost
    longs = [who for who, _ in ran if who != "query"]
    assert all(longs[:45].count(name) <= 20 for name in names)  # shared, not one after another


def test_waiting_queries_of_one_key_run_as_one_batch():
    scheduler = Scheduler()
    merged: list[list[int]] = []

    def merge(items: list[int]) -> list:
        merged.append(list(items))
        return [ValueError("odd") if item % 2 else item * 10 for item in items]

    with held(scheduler):
        callers = [in_thread(lambda n=n: _batched(scheduler, f"client {n}", n, merge)) for n in range(6)]
        time.sleep(0.5)  # all six waiting
    for thread, _ in callers:
        thread.join()
    assert merged == [[0, 1, 2, 3, 4, 5]] or sorted(merged[0]) == [0, 1, 2, 3, 4, 5]
    answers = {n: found[0] for n, (_, found) in enumerate(callers)}
    assert {n: a for n, a in answers.items() if n % 2 == 0} == {0: 0, 2: 20, 4: 40}
    assert all(isinstance(answers[n], ValueError) for n in (1, 3, 5))  # an error is its own caller's


def _batched(scheduler: Scheduler, client: str, item: int, merge):
    with scheduler.job(client, "search") as job:
        return scheduler.run_batched(job, "key", item, merge)


def test_past_its_bound_the_queue_refuses_and_says_when_to_come_back():
    scheduler = Scheduler(max_jobs=1)
    with scheduler.job("daemon", "warm-up", background=True) as quiet:
        with held(scheduler), scheduler.job("late", "search") as job:
            started = time.monotonic()
            with pytest.raises(Busy, match=r"busy: 1 requests are waiting .* try again in \d+ s") as refused:
                scheduler.run(job, lambda: None)
            assert refused.value.retry_after >= 1 and time.monotonic() - started < 1
            thread, found = in_thread(lambda: scheduler.run(quiet, lambda: "done"))  # never refused
        thread.join()
    assert found == ["done"]


def test_a_cancelled_job_loses_its_waiting_slices_at_once():
    scheduler = Scheduler()
    ran = []
    cancel = threading.Event()

    def waiting() -> None:
        with scheduler.job("gone", "embed", cancel=cancel) as job:
            scheduler.run(job, lambda: ran.append("gone"))

    with held(scheduler):
        thread, found = in_thread(waiting)
        time.sleep(0.3)
        cancel.set()
        thread.join(2)
        assert not thread.is_alive() and isinstance(found[0], Cancelled)
    with scheduler.job("next", "search") as job:
        scheduler.run(job, lambda: ran.append("next"))
    assert ran == ["next"]
    assert scheduler.status()["jobs"] == []


def test_close_returns_once_the_slice_running_has_ended():
    """A process that exits right after close() must not end inside the model: torch aborts it
    ("terminate called without an active exception", seen once in CI from `ragidx ask`)."""
    before = set(threading.enumerate())  # other tests' schedulers may still run their threads
    scheduler = Scheduler()
    started, ended = threading.Event(), []

    def slow() -> None:
        started.set()
        time.sleep(0.5)
        ended.append(time.monotonic())

    def running() -> None:
        with scheduler.job("asker", "ask") as job:
            scheduler.run(job, slow)

    thread, _ = in_thread(running)
    assert started.wait(10)
    scheduler.close()
    returned = time.monotonic()
    assert ended and ended[0] <= returned
    assert not [t for t in set(threading.enumerate()) - before if t.name == "ragidx-model"]
    thread.join(10)


def test_background_work_runs_only_when_nothing_else_waits():
    scheduler = Scheduler()
    ran = []
    with (
        scheduler.job("daemon", "warm-up", background=True) as quiet,
        scheduler.job("client", "search") as job,
    ):
        with held(scheduler):
            background, _ = in_thread(lambda: scheduler.run(quiet, lambda: ran.append("background")))
            time.sleep(0.2)
            foreground, _ = in_thread(lambda: scheduler.run(job, lambda: ran.append("foreground")))
            time.sleep(0.2)
            status = scheduler.status()["jobs"]
            assert [(j["client"], j["state"]) for j in status] == [
                ("holder", "running"), ("daemon", "waiting"), ("client", "waiting")
            ]  # fmt: skip
        background.join()
        foreground.join()
    assert ran == ["foreground", "background"]


@pytest.fixture
def dense_zero(tmp_path, tiny_models, sample_corpus) -> Path:
    """An index whose tuned fusion weighs the vectors 0: its hybrid search is keyword search."""
    index = tmp_path / "index"
    options = {"model": str(tiny_models["llama"]), "device": "cpu", "progress": False, "tune": False}
    Index.update([sample_corpus], index, **options)
    with sqlite3.connect(index / "ragidx.db") as db:
        fusion = {"method": "rrf", "weights": {"dense": 0.0, "lexical": 1.0}, "chunks": 1}
        db.execute("update meta set value = ? where key = 'fusion'", [json.dumps(fusion)])
        if db.execute("select changes()").fetchone()[0] == 0:
            db.execute("insert into meta values ('fusion', ?)", [json.dumps(fusion)])
    return index


def test_a_search_that_needs_no_model_never_waits_for_it(dense_zero, tiny_models):
    from ragidx.indexer.search.options import SearchOptions

    scheduler = Scheduler()
    with Index.open(dense_zero, device="cpu") as index:
        served = ServedIndex(index, scheduler)
        assert not served.embeds_queries()
        with scheduler.job("client", "search") as job:
            with held(scheduler):
                started = time.monotonic()
                hybrid = served.search("why are there two tides a day", SearchOptions.of(k=3), job)
                lexical = served.search(
                    "why are there two tides a day", SearchOptions.of(k=3, mode="lexical"), job
                )
                assert time.monotonic() - started < 1  # the model's thread is held all along
                dense, found = in_thread(
                    lambda: served.search("tides", SearchOptions.of(k=3, mode="dense"), job)
                )
                time.sleep(0.3)
                assert not found  # this one waits for the model
            dense.join()
        assert [h.chunk_id for h in hybrid] == [h.chunk_id for h in lexical]
        assert len(found[0]) == 3
        assert index._strategy is not None  # loaded by the dense search, on the model's thread


def test_a_long_embed_is_sliced_and_a_cancelled_one_stops(small_index):
    """Slices of about SLICE_SECONDS at the measured pace (here 10 ms a text: 40 texts a slice)."""
    scheduler = Scheduler()
    texts = [f"text number {n} about the tides" for n in range(100)]
    with Index.open(small_index, device="cpu") as index:
        expected = index.embed(texts, "query")
        original, sizes = index.embed, []

        def slow(batch, role="query"):
            sizes.append(len(batch))
            time.sleep(0.01 * len(batch))
            return original(batch, role)

        index.embed = slow
        served = ServedIndex(index, scheduler)
        with scheduler.job("client", "embed") as job:
            vectors = served.embed(texts, "query", job)
        np.testing.assert_allclose(vectors, expected, atol=1e-5)
        assert sizes[0] == 4 and sum(sizes) == 100 and all(size <= 45 for size in sizes) and len(sizes) >= 3
        cancel = threading.Event()
        with scheduler.job("gone", "embed", cancel=cancel) as job:
            thread, found = in_thread(lambda: served.embed(texts * 20, "query", job))
            while job.slices < 2:
                time.sleep(0.01)
            cancel.set()
            thread.join(5)
        assert isinstance(found[0], Cancelled) and sum(sizes) < 100 + 200


def test_a_chat_endpoint_that_never_ends_is_held_to_its_bounds_and_closed_on_cancel():
    from ragidx.app.generation import ChatEndpoint

    chat = [{"role": "user", "content": "hi"}]
    with FakeChat("endless", delay=0.01) as fake:
        pieces: list[str] = []
        found = ChatEndpoint(fake.url, None).generate(chat, 7, pieces.append)
        assert pieces == ["word "] * 7 and found.text == "word " * 7 and found.new_tokens == 7
        assert fake.closed.wait(5)
    cancel = threading.Event()
    with FakeChat("hang") as fake:
        thread, outcome = in_thread(lambda: ChatEndpoint(fake.url, None).generate(chat, 50, print, cancel))
        assert fake.opened.wait(5)
        cancel.set()
        cancelled = time.monotonic()
        thread.join(5)
        assert isinstance(outcome[0], Cancelled)
        assert fake.closed.wait(5) and fake.closed_at - cancelled < 2


@pytest.fixture
def instruct_index(tmp_path, tiny_models, sample_corpus) -> Path:
    import shutil

    model = tmp_path / "qwen2-instruct"
    shutil.copytree(tiny_models["qwen2"], model)
    (model / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    index = tmp_path / "index"
    Index.update([sample_corpus / "faq"], index, model=str(model), device="cpu", progress=False, tune=False)
    return index


def test_a_local_answer_is_written_a_token_per_slice_as_transformers_would(instruct_index):
    """Through the scheduler a token at a time, with its own key-value cache: the tokens of
    transformers' own greedy decoding, up to the first end token."""
    import torch

    from ragidx.app.answering import messages
    from ragidx.app.generation import stop_ids
    from ragidx.app.service.served_index import Asked
    from ragidx.indexer.search.options import SearchOptions

    scheduler = Scheduler()
    with Index.open(instruct_index, device="cpu") as index:
        served = ServedIndex(index, scheduler)
        with scheduler.job("client", "ask") as job:
            found = served.ask(
                QUESTION, SearchOptions.of(k=2), Asked(max_new_tokens=12), job, lambda text: None
            )
            assert job.slices >= found.new_tokens > 0  # a slice a token
        generator = index.generator()
        tokenizer = generator.runtime.tokenizer
        chat = messages(QUESTION, index.context(QUESTION, k=2))
        prompt = tokenizer.apply_chat_template(
            chat, chat_template=generator.template, add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            written = generator.model.generate(
                ids, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=stop_ids(tokenizer)
            )[0, ids.shape[1] :].tolist()
    written = [token for token in written if token not in stop_ids(tokenizer)]
    assert found.new_tokens == len(written)
    assert found.text == tokenizer.decode(
        written, skip_special_tokens=True, clean_up_tokenization_spaces=False
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_answers_health_and_search_while_an_answer_streams_and_closes_it_when_its_client_leaves(
    dense_zero, tmp_path
):
    pytest.importorskip("fastapi")
    import httpx

    port = free_port()
    with FakeChat("endless", delay=0.05) as fake:
        server = subprocess.Popen(
            [RAGIDX, "serve", "--index", dense_zero, "--port", str(port), "--llm-url", fake.url],
            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_for(f"{base}/health")
            with (
                httpx.Client(timeout=30) as http,
                http.stream(
                    "POST", f"{base}/ask", json={"query": QUESTION, "k": 2, "max_new_tokens": 2000}
                ) as answer,
            ):
                lines = answer.iter_lines()
                first = [json.loads(next(lines)) for _ in range(4)]
                assert all("text" in event for event in first)
                for path in ("/health", "/search?q=tides&k=2", "/info", "/v1/models"):
                    started = time.monotonic()
                    assert http.get(base + path).status_code == 200
                    assert time.monotonic() - started < 1, path
            left = time.monotonic()
            assert fake.closed.wait(5) and fake.closed_at - left < 5  # the endpoint's request closed
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(30)


def _wait_for(url: str) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def daemon_pid(env: dict[str, str]) -> int:
    return json.loads(ragidx("daemon", "status", "--json", env=env).stdout)["pid"]


def test_a_daemon_dense_zero_index_loads_no_model_and_a_withdrawn_daemon_exits(daemon_env, dense_zero):
    query = ("query", "why are there two tides a day", "--index", dense_zero, "--json", "-k", "2")
    assert json.loads(ragidx(*query, env=daemon_env).stdout)
    time.sleep(1.5)  # the idle warm-up's turn
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert status["jobs"] == [] and status["indexes"][0]["model_loaded"] is False  # its searches never embed
    pid = status["pid"]
    (socket_path,) = sockets(daemon_env)
    socket_path.unlink()  # withdrawn: no client can reach it any more
    deadline = time.monotonic() + 3
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_busy_daemon_that_lives_is_waited_for_not_replaced(daemon_env, small_index):
    query = ("query", "tides", "--index", small_index, "--json", "-k", "2")
    expected = ragidx(*query, env=daemon_env).stdout
    pid = daemon_pid(daemon_env)
    os.kill(pid, signal.SIGSTOP)  # as silent as a daemon starved of the CPU or the GIL
    try:
        client = subprocess.Popen(
            [RAGIDX, *map(str, query)], env=daemon_env, stdout=subprocess.PIPE, text=True
        )
        time.sleep(4)  # past its pulse, and past the old rule's patience with a busy machine's scheduling
    finally:
        os.kill(pid, signal.SIGCONT)
    out, _ = client.communicate(timeout=60)
    assert out == expected and client.returncode == 0
    assert daemon_pid(daemon_env) == pid and len(sockets(daemon_env)) == 1


def test_a_daemon_killed_mid_answer_is_reported_not_asked_again(daemon_env, instruct_index):
    with FakeChat("endless", delay=0.1) as fake:
        ragidx("query", "refund", "--index", instruct_index, env=daemon_env)  # the daemon runs
        pid = daemon_pid(daemon_env)
        command = [RAGIDX, "ask", QUESTION, "--index", instruct_index, "--llm-url", fake.url]
        asking = subprocess.Popen(
            [*command, "--max-new-tokens", "500"], env=daemon_env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert fake.opened.wait(30)
        time.sleep(0.5)  # a few pieces printed
        os.kill(pid, signal.SIGKILL)
        out, err = asking.communicate(timeout=60)
    assert asking.returncode != 0 and len(fake.requests) == 1  # not asked again in the CLI's process
    assert out.strip() and set(out.split()) == {"word"}
    assert err.strip().splitlines()[-1].startswith("error: the daemon stopped while answering after part")
    ragidx("query", "refund", "--index", instruct_index, env=daemon_env)  # a new daemon, and one only
    assert daemon_pid(daemon_env) != pid and len(sockets(daemon_env)) == 1


@contextlib.contextmanager
def running_daemon(folder: Path):
    from ragidx.app.daemon.server import Daemon

    daemon = Daemon(folder / "d.sock", idle=120)
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        yield daemon
    finally:
        daemon.stopping = True
        runner.join(60)


def request(path: Path, body: dict) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(str(path))
    connection.sendall(json.dumps(body).encode() + b"\n")
    return connection


def test_a_daemon_query_waits_one_slice_behind_a_long_embed_whose_client_then_vanishes(
    small_index, monkeypatch, tmp_path
):
    """In the daemon: a client embeds 2,000 texts (10 ms each: 20 s of model work) and another
    searches meanwhile, answered in a slice's time; then the first client goes away and its
    embedding stops within a second."""
    original, embedded = Index.embed, []

    def slow(self, texts, role="query"):
        embedded.append(len(texts))
        time.sleep(0.01 * len(texts))
        return original(self, texts, role)

    monkeypatch.setattr(Index, "embed", slow)
    texts = [f"a line about tides, number {n}" for n in range(2000)]
    with running_daemon(tmp_path) as daemon:
        search = {"op": "search", "query": "tides", "index": str(small_index), "options": {"k": 2}}
        assert "hits" in daemon.answer(search)  # loads the model
        long = request(daemon.path, {"op": "embed", "index": str(small_index), "texts": texts})
        while sum(embedded) < 200:
            time.sleep(0.05)
        started = time.monotonic()
        assert len(daemon.answer(search)["hits"]) == 2
        assert time.monotonic() - started < 2  # a slice (~0.4 s) behind the embedding, not 20 s
        jobs = daemon.status()["jobs"]
        assert [job["operation"] for job in jobs] == ["embed"] and jobs[0]["client"] == f"pid {os.getpid()}"
        long.close()
        closed, before = time.monotonic(), sum(embedded)
        while daemon.status()["jobs"] and time.monotonic() - closed < 5:
            time.sleep(0.05)
        assert daemon.status()["jobs"] == [] and time.monotonic() - closed < 2
        assert sum(embedded) - before < 200 and sum(embedded) < 1500  # stopped, not finished
