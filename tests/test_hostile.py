"""Hostile inputs and damaged indexes: what a careless keystroke, a planted link, a special or
huge file, a pathological document, or a damaged index file does to ragidx. Each case is bounded
in time (and memory, where that is the danger) and must end in a skip, a refusal or a repair,
never in a hang, a flood, a traceback or data read from outside the indexed folders."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
from pathlib import Path

import pytest

from ragidx.app import Index, RagidxError
from tests.support.child_setup import bounded_memory, prepared
from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx


def bounded(*args: str | Path, seconds: float = 180) -> subprocess.CompletedProcess:
    """``ragidx ARGS`` in a child that may use at most :data:`child_setup.MEMORY_LIMIT` of address
    space and ``seconds`` of time: a regression that hangs or floods memory fails this test, not
    the run."""
    return subprocess.run(
        prepared(bounded_memory, [RAGIDX, *args]),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=seconds,
    )


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


DOCS = {
    "notes/tides.md": "# Tides\n\nThe Moon pulls the near-side ocean. Two bulges make two tides a day.\n",
    "notes/kelp.md": "# Kelp\n\nKelp forests grow quickly in cold, nutrient-rich water.\n",
    "faq/returns.md": "# Returns\n\nBikes may be returned within thirty days with the receipt.\n",
}


@pytest.fixture
def small_index(tmp_path, tiny_models) -> tuple[Path, Path]:
    corpus = write(tmp_path / "corpus", DOCS)
    index = tmp_path / "index"
    Index.update([corpus], index, model=str(tiny_models["qwen2"]), device="cpu", progress=False, tune=False)
    return corpus, index


def documents(index: Path) -> list[str]:
    with Index.open(index) as opened:
        return [row["path"] for row in opened.reader.document_rows()]


def test_rm_refuses_an_empty_path_and_a_folder_holding_everything(small_index, monkeypatch):
    corpus, index = small_index
    before = documents(index)
    monkeypatch.chdir(corpus)
    assert_one_line_error(ragidx("rm", "", "--index", index, check=False), "an empty path would mean")
    with Index.open(index) as opened:
        with pytest.raises(RagidxError, match="an empty path"):
            opened.remove(["  "])
        with pytest.raises(RagidxError, match=r"holds every indexed document \(3\): pass --all"):
            opened.remove(["."])
        dry = opened.remove([corpus / "notes"], dry_run=True)
        assert dry.dry_run and len(dry.removed) == 2 and opened.meta["generation"] == 1
    assert documents(index) == before
    out = ragidx("rm", corpus, "--index", index, "--all", check=False)
    assert_one_line_error(out, "give paths to remove, or --all, not both")
    with Index.open(index) as opened:
        assert opened.remove([corpus / "faq" / "returns.md"]).removed == [str(corpus / "faq" / "returns.md")]
        report = opened.remove(everything=True)
        assert report.removed == [path for path in before if "/notes/" in path] and report.documents == 0


def test_links_to_outside_special_files_and_huge_files_are_skipped_not_read(tmp_path, tiny_models):
    corpus = write(tmp_path / "corpus", DOCS)
    secret = write(tmp_path / "outside", {"secret.md": "# Secret\n\nThe vault code is plover-seventeen.\n"})
    (corpus / "notes" / "p.md").symlink_to(secret / "secret.md")
    (corpus / "notes" / "zero.md").symlink_to("/dev/zero")
    (corpus / "notes" / "inside.md").symlink_to(corpus / "notes" / "kelp.md")  # a link within: read
    os.mkfifo(corpus / "notes" / "pipe.md")  # opening it to read would block until a writer came
    with open(corpus / "huge.txt", "wb") as huge:  # sparse: 65 MiB of size, nothing on disk
        huge.truncate(65 * 2**20)
    index = tmp_path / "index"
    build = ("build", corpus, "--model", tiny_models["qwen2"], "--index", index, "--no-tune", "--json")
    result = bounded(*build)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    reasons = {Path(item["path"]).name: item["reason"] for item in report["skipped"]}
    assert reasons["p.md"] == reasons["zero.md"] == "a link to outside the indexed folders: not followed"
    assert reasons["pipe.md"] == "not a regular file (a FIFO)"
    assert reasons["huge.txt"].startswith("larger than 64.0 MB (65.0 MB; raise it with --max-file-mb)")
    assert report["total_documents"] == 4  # the three documents and the link inside the corpus
    with Index.open(index) as opened:
        assert opened.search("vault code plover", mode="lexical") == []
        assert opened.settings.roots == (str(corpus.resolve()),)
    smaller = json.loads(bounded(*build, "--max-file-mb", "0.001").stdout)  # 1 kB: the DOCS stay
    assert "huge.txt" in {Path(item["path"]).name for item in smaller["skipped"]}
    assert smaller["total_documents"] == 4


def test_a_document_swapped_for_a_link_after_indexing_is_not_served(small_index, tmp_path):
    from ragidx.app.mcp.server import create_server, current_text

    corpus, index = small_index
    secret = write(tmp_path / "outside", {"secret.md": "The vault code is plover-seventeen.\n"})
    tides = corpus / "notes" / "tides.md"
    with Index.open(index) as opened:
        server = create_server(opened)
        row = opened.reader.document_rows(str(tides))[0]
        assert current_text(row, server.access())[0].startswith("# Tides")
        tides.unlink()
        tides.symlink_to(secret / "secret.md")
        with pytest.raises(RagidxError, match="a link to outside the indexed folders"):
            current_text(row, server.access())
        tides.unlink()
        os.mkfifo(tides)
        with pytest.raises(RagidxError, match="not a regular file"):
            current_text(row, server.access())


def test_pathological_small_files_cost_linear_time_and_bounded_memory(tmp_path, tiny_models):
    """A YAML alias bomb (320 bytes, 39 MB of metadata once expanded), HTML nested 100,000 deep, and
    a 50 kB run of '>' (spaCy's tokenizer strips such a run one character at a time)."""
    import time

    from transformers import AutoTokenizer

    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.ingest.sources import read_document

    levels = [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 4)}]\n" for i in range(9)]
    bomb = "---\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(levels) + "---\n\nBody text.\n"
    corpus = write(tmp_path / "corpus", {"bomb.md": bomb, "walls.md": "Before.\n\n" + ">" * 50_000 + "\n"})
    (corpus / "deep.html").write_text("<div>x" * 100_000 + "</div>" * 100_000, encoding="utf-8")
    started = time.perf_counter()
    assert read_document(corpus / "bomb.md").reason.startswith("metadata too large")
    deep = read_document(corpus / "deep.html")
    assert deep.text == "\n\n".join(["x"] * 100_000)
    chunker = Chunker(AutoTokenizer.from_pretrained(tiny_models["qwen2"]), chunk_tokens=64)
    chunks = chunker.chunk(read_document(corpus / "walls.md").text)
    assert chunks[0].text == "Before." and "".join(c.text for c in chunks[1:]) == ">" * 50_000
    assert time.perf_counter() - started < 30  # minutes before; about 3 s on two cores now


def test_a_file_name_that_is_not_utf8_or_holds_escapes_is_skipped_or_shown_safely(tmp_path, tiny_models):
    corpus = write(tmp_path / "corpus", DOCS)
    (corpus / os.fsdecode(b"bad-\xff.md")).write_text("Latin-1 name.\n", encoding="utf-8")
    (corpus / "\x1b[31mred.md").write_text("# Red\n\nA name with a terminal escape.\n", encoding="utf-8")
    index = tmp_path / "index"
    out = ragidx("build", corpus, "--model", tiny_models["qwen2"], "--index", index, "--no-tune").stdout
    assert "bad-\\xff.md: file name is not valid UTF-8: rename it" in out
    assert "\x1b" not in out
    found = ragidx("query", "terminal escape", "--index", index, "--mode", "lexical", "-k", "1").stdout
    assert "\\x1b[31mred.md" in found and "\x1b" not in found


def test_mcp_answers_every_malformed_message_and_ends_with_its_input(small_index):
    """Each line gets its JSON-RPC error within seconds (the SDK alone answered none, so the client
    waited forever), a well-formed ping still gets its answer, and closing stdin ends the server."""
    import time

    pytest.importorskip("mcp")
    _, index = small_index
    process = subprocess.Popen(
        [RAGIDX, "mcp", "--index", str(index)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    sent = [
        (b"not json at all", (-32700, None)),
        (b"[]", (-32600, None)),
        (b"null", (-32600, None)),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', (-32600, None)),
        (b'{"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"q": "\\ud800"}}', (-32700, 5)),
        (b'{"jsonrpc": "2.0", "id": 6}', (-32600, 6)),
        (b'{"jsonrpc": "2.0", "id": 7, "method": "ping"}', None),
    ]
    try:
        for line, expected in sent:
            process.stdin.write(line + b"\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 10)
            assert ready, f"no answer to {line!r}"
            answer = json.loads(process.stdout.readline())
            if expected is None:
                assert answer == {"jsonrpc": "2.0", "id": 7, "result": {}}
            else:
                assert (answer["error"]["code"], answer["id"]) == expected
                assert len(answer["error"]["message"]) < 120 and "ud800" not in answer["error"]["message"]
        process.stdin.close()
        started = time.monotonic()
        assert process.wait(timeout=20) == 0 and time.monotonic() - started < 20
    finally:
        process.kill()


def test_mcp_argument_errors_are_one_short_line_without_the_input(small_index):
    from tests.support.mcp_client import session

    pytest.importorskip("mcp")
    _, index = small_index
    huge = "9" * 200_000

    async def script(client) -> list:
        return [
            await client.call_tool("search", {"query": "tides", "k": huge}),
            await client.call_tool("search", {"query": "tides", "k": True}),
            await client.call_tool("search", {"query": "x" * 30_000}),
        ]

    results = session(index, script)
    for result in results:
        text = result.content[0].text
        assert result.is_error and text.startswith("invalid arguments: ") and len(text) < 200, text
    assert "k: Input should be a valid integer" in results[1].content[0].text


def test_the_http_server_checks_host_token_and_inputs(small_index):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ragidx.app.http.server import create_app

    _, index = small_index
    with Index.open(index, device="cpu") as opened:
        open_app = TestClient(create_app(opened), base_url="http://127.0.0.1:8000")
        assert open_app.get("/health").status_code == 200
        rebound = open_app.get("/health", headers={"Host": "attacker.example"})
        assert rebound.status_code == 400  # DNS rebinding: a page of attacker.example cannot read it
        assert open_app.get("/docs").status_code == 404  # Swagger's page loads scripts from a CDN
        page = open_app.get("/").text
        assert "src=" not in page and "https://" not in page and "http://" not in page
        for body, field in (
            ({"query": "x", "filters": {"path": "*" * 50_000}}, "at most 1000"),
            ({"query": "x", "k": True}, "k: Input should be a valid integer"),
            ({"query": "x", "k": "10"}, "k: Input should be a valid integer"),
            ({"query": "x", "min_score": "nan"}, "min_score"),
        ):
            response = open_app.post("/search", json=body)
            assert response.status_code == 422 and field in response.json()["detail"], response.text
        assert open_app.post("/embed", json={"texts": [""], "role": "document"}).status_code == 422
        guarded = TestClient(create_app(opened, token="s3cret"), base_url="http://localhost")
        assert guarded.get("/").status_code == 200  # the static page, which sends the token itself
        assert guarded.post("/search", json={"query": "tides"}).status_code == 401
        assert guarded.get("/info", headers={"Authorization": "Bearer wrong"}).status_code == 401
        authorised = guarded.post(
            "/search", json={"query": "tides"}, headers={"Authorization": "Bearer s3cret"}
        )
        assert authorised.status_code == 200 and authorised.json()["hits"]
        for scheme in ("bearer", "BEARER"):  # the scheme is case-insensitive (RFC 9110), the token not
            assert guarded.get("/health", headers={"Authorization": f"{scheme} s3cret"}).status_code == 200
        assert guarded.get("/health", headers={"Authorization": "Bearer S3CRET"}).status_code == 401
        assert guarded.get("/health", headers={"Authorization": "Basic s3cret"}).status_code == 401


def test_the_token_can_come_from_a_private_file(tmp_path):
    from ragidx.cli import _read_token

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with pytest.raises(RagidxError, match=r"may be read by other users: chmod 600 it"):
        _read_token(token, None)
    token.chmod(0o600)
    assert _read_token(token, None) == "s3cret"
    with pytest.raises(RagidxError, match=r"--token \(or RAGIDX_TOKEN\) or by --token-file, not both"):
        _read_token(token, "other")
    refused = ragidx("serve", "--index", tmp_path, "--token-file", tmp_path / "missing", check=False)
    assert_one_line_error(refused, r"cannot read --token-file .*missing: No such file or directory")


def test_slow_requests_are_cut_off_and_connections_capped(small_index):
    """Connections that trickle a request's head (or body) are closed at the deadline; a request
    past the cap is answered 503 with Retry-After (not reset), connections past four times the cap
    are closed at once, and a normal request is answered once the slow ones are gone."""
    import threading
    import time

    pytest.importorskip("uvicorn")
    import httpx
    import uvicorn

    from ragidx.app.http.limits import limited_protocol
    from ragidx.app.http.server import create_app, listening_socket

    _, index = small_index
    with Index.open(index, device="cpu") as opened:
        sock = listening_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(opened), http=limited_protocol(1.0, 8), log_level="critical")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            while not server.started:
                time.sleep(0.05)

            def trickle(count: int) -> list[socket.socket]:
                opened = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
                for connection in opened:
                    connection.sendall(b"POST /search HTTP/1.1\r\nHost: localhost\r\n")  # and no more
                time.sleep(0.3)
                return opened

            slow = trickle(30)
            assert _closed(slow) == []  # past the cap of 8, but under 4 x 8: kept until the deadline
            refused = httpx.post(f"http://localhost:{port}/search", json={"query": "tides"}, timeout=30)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
            assert "retry after 1 s" in refused.json()["detail"]
            flood = trickle(4)
            assert len(_closed(flood)) == 2  # the 33rd and 34th connections: closed at once
            slow += flood
            started = time.monotonic()
            while len(_closed(slow)) < len(slow) and time.monotonic() - started < 5:
                time.sleep(0.05)
            assert len(_closed(slow)) == len(slow) and time.monotonic() - started < 2  # the 1 s deadline
            answer = httpx.post(f"http://localhost:{port}/search", json={"query": "tides"}, timeout=30)
            assert answer.status_code == 200
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:  # one kept-alive connection
                client.get("/health")
                (held,) = server.server_state.connections  # its socket sends without waiting for ACKs
                sock = held.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                took = []
                for _ in range(10):
                    started = time.perf_counter()
                    client.get("/health")
                    took.append(time.perf_counter() - started)
                assert sorted(took)[5] < 0.03  # 44 ms each while the body waited for a delayed ACK
        finally:
            server.should_exit = True
            thread.join(10)


def _closed(connections: list[socket.socket]) -> list[socket.socket]:
    """The connections the server has closed by now (end of file, or reset)."""
    readable, _, _ = select.select(connections, [], [], 0)
    found = []
    for connection in readable:
        try:
            if connection.recv(1, socket.MSG_PEEK) == b"":
                found.append(connection)
        except ConnectionResetError:
            found.append(connection)
    return found


def test_serve_refuses_before_loading_anything(small_index):
    import time

    pytest.importorskip("uvicorn")
    _, index = small_index
    exposed = ragidx("serve", "--index", index, "--host", "0.0.0.0", "--port", "0", check=False)
    assert_one_line_error(
        exposed, "listening on 0.0.0.0 serves the index beyond this machine: give it a --token"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        started = time.monotonic()
        busy = ragidx("serve", "--index", index, "--port", taken.getsockname()[1], check=False)
        assert_one_line_error(busy, r"cannot listen on 127\.0\.0\.1:\d+: Address already in use")
        assert time.monotonic() - started < 30  # before the model (and before serving)


def test_damaged_index_parts_are_repaired_or_refused_with_what_to_do(small_index, tiny_models):
    import errno
    import sqlite3

    from ragidx.indexer.storage.local import segments as segments_module

    corpus, index = small_index
    database = index / "ragidx.db"

    def sql(statement: str, *params) -> None:
        with sqlite3.connect(database) as db:
            db.execute(statement, params)

    def check(repair: bool = False) -> list[str]:
        return [problem.kind for problem in Index.check(index, repair=repair).problems]

    with sqlite3.connect(database) as db:
        blob = db.execute("select ids from segments").fetchone()[0]
    sql("update segments set ids = ?", blob[:-3])  # a truncated record: 8-byte ids, 3 bytes short
    with Index.open(index) as opened:
        assert opened.search("tides", k=1, mode="dense")  # the file's own ids are searched
    assert check() == ["segment-records"]
    assert check(repair=True) == ["segment-records"] and check() == []

    sql("drop table chunks_terms")
    with Index.open(index) as opened, pytest.raises(RagidxError, match=r"keyword index .* is missing"):
        opened.search("tides", mode="lexical")
    assert check() == ["lexical-index"]
    check(repair=True)
    with Index.open(index) as opened:
        assert check() == [] and opened.search("tides", mode="lexical")

    sql("update meta set value = '7' where key = 'dimension'")
    assert check() == ["dimension"]
    sql("update meta set value = '64' where key = 'dimension'")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    (corpus / "new.md").write_text("# New\n\nA new note about lagoons.\n", encoding="utf-8")
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False, "tune": False}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segments_module, "write_faiss_file", disk_full)
        with pytest.raises(RagidxError, match=r"disk holding .* is full: nothing was committed"):
            Index.update([corpus], index, **options)
    assert Index.open(index).meta["generation"] == 1 and check() == []  # unchanged

    with open(database, "r+b") as file:  # garbage over one page of the chunks' table
        file.seek(4096 * 5)
        file.write(os.urandom(4096))
    assert check() == ["database"]
    with pytest.raises(RagidxError, match=r"is damaged .*nothing is written onto it: `ragidx build"):
        Index.update([corpus], index, **options)

    fresh = index.parent / "fresh"
    Index.update([corpus], fresh, **options)
    with sqlite3.connect(fresh / "ragidx.db") as db:
        db.execute("delete from meta where key = 'model'")
    with pytest.raises(
        RagidxError, match="the index's settings are damaged \\('model' is missing or wrong\\)"
    ):
        Index.open(fresh)
    a_file = index.parent / "a-file"
    a_file.write_text("not a folder")
    assert_one_line_error(ragidx("build", corpus, "--index", a_file, check=False), "is a file, not a folder")
