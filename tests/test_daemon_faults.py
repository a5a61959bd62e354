"""Long-running readers under faults: the daemon, `ragidx serve`, `ragidx mcp` and a Python
`Index` held open, while their index is deleted, replaced or swapped and their clients vanish,
stall or hang. Each case is bounded in time: a regression that hangs fails its test, not the run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ragidx.app import Index, RagidxError
from ragidx.app.daemon import address as daemon_address
from ragidx.app.daemon import client as daemon_client
from ragidx.app.daemon.server import REQUEST_SECONDS, Client, Daemon
from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx
from tests.support.daemon import alive, sockets

QUERY = "how does it work and what should I know"
Ask = Callable[[], list[str] | str]  # the hits' folders for QUERY, or the error's text


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, tiny_models, sample_corpus) -> dict[str, Path]:
    """An index of each sample folder (notes, faq, articles), to copy into place."""
    root = tmp_path_factory.mktemp("corpora")
    built = {}
    for name in ("notes", "faq", "articles"):
        options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False, "tune": False}
        Index.update([sample_corpus / name], root / name, **options)
        built[name] = root / name
    return built


def folders(hits: list[dict]) -> list[str]:
    return sorted({Path(hit["path"]).parent.name for hit in hits})


def replace_under(ask: Ask, index: Path, corpora: dict[str, Path]) -> None:
    """The reader at ``index`` answers from notes; then from faq once that index is swapped in by
    ``mv``; "no index" once it is deleted; then from articles once an index is built there again."""
    shutil.copytree(corpora["notes"], index)
    assert ask() == ["notes"]
    shutil.copytree(corpora["faq"], index.with_name("faq"))
    index.rename(index.with_name("old"))
    index.with_name("faq").rename(index)
    assert ask() == ["faq"]
    shutil.rmtree(index)
    assert "no index at" in ask()
    shutil.copytree(corpora["articles"], index)
    assert ask() == ["articles"]


def test_the_daemon_follows_its_index_deleted_replaced_or_swapped(daemon_env, corpora, tmp_path):
    index = tmp_path / "index"

    def ask() -> list[str] | str:
        found = ragidx("query", QUERY, "--index", index, "--json", env=daemon_env, check=False)
        return folders(json.loads(found.stdout)) if found.returncode == 0 else found.stderr

    replace_under(ask, index, corpora)
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert status["requests"] == 4  # one daemon answered all four, the missing index included


def test_a_python_index_held_open_follows_it(corpora, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    opened = Index.open(index, device="cpu")
    shutil.rmtree(index)

    def ask() -> list[str] | str:
        try:
            return folders([hit.to_dict() for hit in opened.search(QUERY)])
        except RagidxError as error:
            return str(error)

    try:
        replace_under(ask, index, corpora)
    finally:
        opened.close()


def test_the_http_server_follows_it(corpora, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ragidx.app.http.server import create_app

    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    opened = Index.open(index, device="cpu")
    client = TestClient(create_app(opened), base_url="http://127.0.0.1:8000")
    shutil.rmtree(index)

    def ask() -> list[str] | str:
        answer = client.post("/search", json={"query": QUERY})
        assert client.get("/health").status_code == answer.status_code  # both follow the same file
        return folders(answer.json()["hits"]) if answer.status_code == 200 else answer.json()["detail"]

    try:
        replace_under(ask, index, corpora)
    finally:
        opened.close()


def test_the_mcp_server_follows_it(corpora, tmp_path):
    mcp = pytest.importorskip("mcp")
    from mcp.client.stdio import StdioServerParameters

    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)

    async def main() -> None:
        server = StdioServerParameters(command=RAGIDX, args=["mcp", "--index", str(index)], env=child_env())
        async with mcp.Client(server, read_timeout_seconds=120) as client:

            async def search() -> list[str] | str:
                result = await client.call_tool("search", {"query": QUERY})
                if result.is_error:
                    return result.content[0].text
                return folders(result.structured_content["hits"])

            shutil.rmtree(index)
            loop = asyncio.get_running_loop()
            ask = lambda: asyncio.run_coroutine_threadsafe(search(), loop).result(60)  # noqa: E731
            await asyncio.to_thread(replace_under, ask, index, corpora)

    asyncio.run(asyncio.wait_for(main(), 300))


def _request(path: Path, request: dict) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(str(path))
    connection.sendall(json.dumps(request).encode() + b"\n")
    return connection


def test_no_client_can_stop_or_hold_up_the_daemon(daemon_env, corpora, tmp_path):
    """Clients that vanish before their answer, stall half-way through a request or trickle it
    byte by byte: the daemon goes on answering the others at once, and stops when told."""
    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    query = ("query", "tides", "--index", index, "--json", "-k", "3")
    expected = ragidx(*query, env=daemon_env).stdout
    (path,) = sockets(daemon_env)
    pid = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)["pid"]
    # each goes away while the daemon embeds its texts; the next query waits for that work (one
    # model request at a time), and is answered all the same
    texts = ["a sentence about the tides and the moon"] * 32
    for _ in range(3):
        _request(path, {"op": "embed", "index": str(index), "texts": texts}).close()
    assert ragidx(*query, env=daemon_env).stdout == expected
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(str(path))
    stalled.sendall(b'{"op": "search", "ind')  # half a request, then nothing
    trickling = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    trickling.connect(str(path))
    started = time.monotonic()
    assert ragidx(*query, env=daemon_env).stdout == expected
    assert time.monotonic() - started < REQUEST_SECONDS  # the stalled ones delayed nobody
    cut = None
    for byte in b'{"op": "status"':  # one byte a second: cut off at the deadline all the same
        try:
            trickling.send(bytes([byte]))
        except OSError:
            cut = time.monotonic() - started
            break
        time.sleep(0.5)
    assert cut is not None and cut < REQUEST_SECONDS + 2
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert alive(pid) and status["pid"] == pid
    started = time.monotonic()
    assert ragidx("daemon", "stop", env=daemon_env).stdout.startswith(f"stopped daemon {pid}")
    assert time.monotonic() - started < 5
    stalled.close()
    log = path.with_suffix(".log").read_text()
    assert "went away before its answer" in log and "no whole request" in log


def test_a_stopping_daemon_answers_before_it_ends(tmp_path, monkeypatch):
    """The stop's own answer (here slow to send) goes out before run() returns, after which the
    process exits and would take an unsent answer with it."""
    slow_send = Client.send

    def send(client: Client, data: bytes) -> None:
        if data.strip():
            time.sleep(0.5)
        slow_send(client, data)

    monkeypatch.setattr(Client, "send", send)
    daemon = Daemon(tmp_path / "d.sock", idle=60)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(tmp_path / "d.sock"))
        client.sendall(b'{"op": "stop"}\n')
        daemon.run()
        client.settimeout(0)
        assert json.loads(client.recv(1 << 16)) == {"stopped": True, "pid": os.getpid()}
    assert not (tmp_path / "d.sock").exists()


def test_every_request_uses_the_model_on_the_schedulers_thread(tmp_path, corpora, index_threads):
    """Requests arrive on threads of their own; the model's work (embeddings, warm-up included)
    runs on the daemon's scheduler's one thread, whose answers they get; errors are answers."""
    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    used = index_threads("embed")
    daemon = Daemon(tmp_path / "d.sock", idle=60)
    request = {"op": "search", "query": "tides", "index": str(index), "options": {"k": 2}}
    answers, callers = [], set()

    def ask() -> None:
        callers.add(threading.get_ident())
        answers.append(daemon.answer(request))

    for _ in range(3):
        caller = threading.Thread(target=ask)
        caller.start()
        caller.join()
    with daemon.scheduler.job("test", "thread") as job:
        model = daemon.scheduler.run(job, threading.get_ident)
    assert used["embed"] == {model} and model not in callers
    assert len(answers) == 3 and answers[0] == answers[2] and len(answers[0]["hits"]) == 2
    gone = daemon.answer({**request, "index": str(tmp_path / "none")})
    assert gone["error"].startswith("no index at")
    daemon.close()


def test_a_hung_daemon_costs_a_query_its_silence_deadline_only(daemon_env, corpora, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    query = ("query", "tides", "--index", index, "--json", "-k", "3")
    daemon_env = {**daemon_env, "RAGIDX_DAEMON_SILENCE": "3"}  # 60 s unless set: the same daemon
    expected = ragidx(*query, env=daemon_env).stdout
    pid = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        answered = ragidx(*query, env=daemon_env)  # in its own process, once the daemon stays silent
        waited = time.monotonic() - started
        assert answered.stdout == expected
        assert 3 <= waited < 3 + 30
        started = time.monotonic()  # its socket was withdrawn: the next query starts a new daemon
        assert ragidx(*query, env=daemon_env).stdout == expected
        assert time.monotonic() - started < daemon_client.SILENCE_SECONDS
        status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
        assert status["pid"] != pid
        assert not alive(pid)  # stopped by the client that found it silent: never two daemons
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_daemon_that_cannot_start_costs_a_query_nothing(daemon_env, corpora, tmp_path, monkeypatch):
    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    refused = ragidx("query", "tides", "--index", index, env={**daemon_env, "RAGIDX_DAEMON_SILENCE": "soon"},
                     check=False)  # fmt: skip
    assert_one_line_error(refused, "RAGIDX_DAEMON_SILENCE='soon' is not a duration")
    for idle in ("0", "ten minutes", "-5", "inf"):
        started = time.monotonic()
        refused = ragidx("query", "tides", "--index", index, env={**daemon_env, "RAGIDX_DAEMON_IDLE": idle},
                         check=False)  # fmt: skip
        assert_one_line_error(refused, "RAGIDX_DAEMON_IDLE=.* is not a duration: give seconds")
        assert time.monotonic() - started < 5 and sockets(daemon_env) == []
    ragidx("query", "tides", "--index", index, env={**daemon_env, "RAGIDX_DAEMON_IDLE": "10m"})
    status = json.loads(ragidx("daemon", "status", "--json", env=daemon_env).stdout)
    assert status["idle_timeout_seconds"] == 600

    monkeypatch.setenv("XDG_RUNTIME_DIR", daemon_env["XDG_RUNTIME_DIR"])
    monkeypatch.setenv("RAGIDX_NO_DAEMON", "0")
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # a daemon that exits at once
    started = time.monotonic()
    with pytest.raises(daemon_address.DaemonUnavailable, match=r"the daemon exited at start \(see .*\.log\)"):
        daemon_client.ask({"op": "status"})
    assert time.monotonic() - started < 5


def test_daemon_status_says_why_none_can_be_used(daemon_env):
    shared = Path(tempfile.mkdtemp(prefix="rgx-", dir="/tmp"))  # short: a socket's path is bounded
    (shared / "ragidx").mkdir(mode=0o755)
    (shared / "ragidx").chmod(0o755)
    said = ragidx("daemon", "status", env={**daemon_env, "XDG_RUNTIME_DIR": str(shared)}).stdout.strip()
    assert said == f"no daemon can be used: {shared / 'ragidx'} is not a private folder of this user"
    assert ragidx("daemon", "status", env=daemon_env).stdout.strip() == "no daemon is running"


def test_a_relative_runtime_folder_is_ignored(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
    assert daemon_address.runtime_folder() == f"/tmp/ragidx-{os.getuid()}"
    assert not (tmp_path / "relative").exists()


def test_check_finds_vectors_of_another_index_and_repair_re_embeds_them(corpora, tmp_path):
    index, intact = tmp_path / "index", tmp_path / "intact"
    shutil.copytree(corpora["faq"], index)
    shutil.copytree(corpora["faq"], intact)
    shutil.copy(corpora["notes"] / "vectors-1.faiss", index / "vectors-1.faiss")
    report = Index.check(index)
    assert not report.healthy
    assert any("is not the one this index wrote" in problem.detail for problem in report.problems)
    repaired = Index.check(index, repair=True)
    assert repaired.healthy and any(problem.kind == "re-embedded" for problem in repaired.problems)
    assert Index.check(index).problems == []
    for query in ("how long does a refund take", "reset my password", "warranty on a frame"):
        with Index.open(index) as mended, Index.open(intact) as original:
            got = [(hit.path, round(hit.score, 4)) for hit in mended.search(query, mode="dense")]
            want = [(hit.path, round(hit.score, 4)) for hit in original.search(query, mode="dense")]
            assert [p for p, _ in got] == [p.replace(str(intact), str(index)) for p, _ in want]
            assert [s for _, s in got] == [s for _, s in want]


def test_vectors_of_another_dimension_are_one_line(corpora, tmp_path):
    import faiss
    import numpy as np

    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    stored = faiss.read_index(str(index / "vectors-1.faiss"))
    ids = faiss.vector_to_array(stored.id_map)
    other = faiss.IndexIDMap2(faiss.IndexFlatIP(stored.d // 2))
    other.add_with_ids(np.ones((len(ids), stored.d // 2), np.float32), ids)
    faiss.write_index(other, str(index / "vectors-1.faiss"))
    found = ragidx("query", "tides", "--index", index, "--mode", "dense", check=False)
    dimensions = rf"the query has {stored.d} dimensions and the stored vectors {stored.d // 2}"
    assert_one_line_error(found, dimensions)


def test_an_index_is_written_only_into_a_new_empty_or_index_folder(tmp_path, tiny_models, sample_corpus):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.txt").write_text("years of work")
    refused = ragidx("build", sample_corpus / "notes", "--model", tiny_models["qwen2"], "--index", home,
                     check=False)  # fmt: skip
    assert_one_line_error(refused, r"--index .*home holds other files \(thesis\.txt\) and no index: give")
    assert sorted(os.listdir(home)) == ["thesis.txt"]


def test_a_read_only_index_can_be_queried_and_checked(corpora, tmp_path):
    from tests.support.cli import ragidx_powerless

    index = tmp_path / "index"
    shutil.copytree(corpora["notes"], index)
    expected = ragidx("query", "tides", "--index", index, "--json").stdout
    for path in (*index.iterdir(), index):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        assert ragidx_powerless("query", "tides", "--index", index, "--json").stdout == expected
        checked = ragidx_powerless("check", "--index", index)
        assert (checked.returncode, checked.stdout.strip()) == (0, "generation 1: ok")
        repair = ragidx_powerless("check", "--repair", "--index", index)
        assert_one_line_error(repair, "is read-only for this user: `ragidx check` without --repair reports")
        assert_one_line_error(ragidx_powerless("build", corpora["notes"], "--index", index),
                              "cannot write the index at .*: this user may only read it")  # fmt: skip
    finally:
        index.chmod(0o755)
    assert sorted(os.listdir(index)) == sorted(os.listdir(corpora["notes"]))  # nothing written there
