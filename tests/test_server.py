"""The HTTP API through the ASGI test client, `ragidx serve` itself, and the search page in a browser."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import RAGIDX, child_env

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from fastapi.testclient import TestClient  # noqa: E402

from ragidx.app import Index  # noqa: E402
from ragidx.app.http.server import create_app  # noqa: E402
from ragidx.app.service.scheduler import Scheduler  # noqa: E402


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, sample_corpus):
    """kv-embedding re-routes attention during each forward: the strategy that needs the lock most."""
    folder = tmp_path_factory.mktemp("server") / "index"
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False}
    with Index.build([sample_corpus], folder, strategy="kv-embedding", layers="2-3", **options) as opened:
        yield opened


@pytest.fixture(scope="module")
def app(index):
    return create_app(index)


@pytest.fixture(scope="module")
def client(app):
    return TestClient(app, base_url="http://localhost")


def search_result(index: Index, query: str, **kwargs) -> list[tuple[int, float]]:
    return [(h.chunk_id, round(h.score, 6)) for h in index.search(query, **kwargs)]


def response_result(response) -> list[tuple[int, float]]:
    assert response.status_code == 200, response.text
    return [(h["chunk_id"], round(h["score"], 6)) for h in response.json()["hits"]]


def test_search_explains_each_hit_as_the_python_api_does(client, index):
    response = client.post("/search", json={"query": "compost", "k": 3, "explain": True})
    expected = [hit.to_dict()["explain"] for hit in index.search("compost", k=3, explain=True)]
    assert [hit["explain"] for hit in response.json()["hits"]] == expected and expected[0]["fusion"]
    assert "explain" not in client.post("/search", json={"query": "compost", "k": 1}).json()["hits"][0]


def test_health_and_info(client, index):
    assert client.get("/health").json() == {"status": "ok", "generation": index.meta["generation"]}
    info = client.get("/info").json()
    assert info["strategy"] == "kv-embedding" and info["chunks"] == index.reader.counts()["chunks"]


def test_search_and_embed_answer_as_the_python_api(client, index):
    body = {
        "query": "password reset link",
        "k": 4,
        "mode": "hybrid",
        "filters": {"ext": ["html", "markdown"]},
        "ef_search": 8,
    }
    got = client.post("/search", json=body)
    assert response_result(got) == search_result(
        index, "password reset link", k=4, filters={"ext": ["html", "markdown"]}
    )
    hit = got.json()["hits"][0]
    assert set(hit) >= {"score", "path", "text", "span", "metadata", "chunk_id", "snippet"}
    weighted = client.post(
        "/search",
        json={"query": "password reset link", "weights": {"dense": 0.2, "lexical": 1}, "fusion": "minmax"},
    )
    assert response_result(weighted) == search_result(
        index, "password reset link", weights={"dense": 0.2, "lexical": 1.0}, fusion="minmax"
    )
    assert response_result(weighted) != response_result(
        client.post("/search", json={"query": "password reset link"})
    )
    vectors = client.post("/embed", json={"texts": ["one", "two words"], "role": "document"}).json()
    assert vectors["dimension"] == 64
    np.testing.assert_allclose(vectors["vectors"], index.embed(["one", "two words"], "document"), atol=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/search", {"query": "x", "k": 0}, "k: Input should be greater than or equal to 1"),
        ("/search", {"query": "x", "k": 5000}, "k: Input should be less than or equal to 1000"),
        ("/search", {"query": "x", "mode": "sparse"}, "mode: Input should be"),
        ("/search", {"k": 3}, "query: Field required"),
        ("/search", {"query": ""}, "query: String should have at least 1 character"),
        ("/search", {"query": "   "}, "the query is empty"),
        ("/search", {"query": "x", "top": 3}, "top: Extra inputs are not permitted"),
        ("/search", {"query": "x", "nprobe": 0}, "nprobe: Input should be greater than or equal to 1"),
        ("/search", {"query": "x", "weights": {"dense": -1}}, "weights.dense: Input should be greater than"),
        ("/search", {"query": "x", "weights": {"sparse": 1}}, "weights.sparse: Extra inputs"),
        (
            "/search",
            {"query": "x", "weights": {"dense": 0}},
            "fusion weights must be finite, non-negative and not",
        ),
        (
            "/search",
            {"query": "x", "mode": "dense", "weights": {"dense": 1}},
            "weights and fusion apply to hybrid",
        ),
        ("/search", {"query": "x", "fusion": "zscore"}, "fusion: Input should be 'rrf' or 'minmax'"),
        ("/search", {"query": "x", "ef_search": 10**6}, "ef_search: Input should be less than or equal to"),
        ("/search", {"query": "x", "filters": {"colour": "red"}}, "filters.colour: Extra inputs"),
        ("/search", {"query": "x", "filters": {"meta": {"bad key": "v"}}}, "metadata key"),
        ("/search", {"query": "x", "filters": {"path": "../../etc/passwd"}}, None),
        ("/embed", {"texts": []}, "texts: List should have at least 1 item"),
        ("/embed", {"texts": [1, 2]}, "texts.0: Input should be a valid string"),
        ("/embed", {"texts": ["x"], "role": "doc"}, "role: Input should be 'document' or 'query'"),
        ("/embed", {"texts": ["x"] * 2049}, "texts: List should have at most 2048 items"),
        (
            "/search?index=/elsewhere",
            {"query": "x"},
            "unknown parameter 'index': a POST takes its options in",
        ),
        ("/embed?role=query", {"texts": ["x"]}, "unknown parameter 'role': a POST takes its options in"),
    ],
)
def test_invalid_requests_get_422_with_a_message(client, path, body, message):
    response = client.post(path, json=body)
    if message is None:  # a path filter only narrows the search: no file is opened, nothing matches
        assert response.status_code == 200 and response.json()["hits"] == []
        return
    assert response.status_code == 422
    assert response.json()["detail"].startswith(message) or message in response.json()["detail"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"query": "x", "min_score": NaN}', "min_score: Input should be a finite number"),
        (b'{"query": "x", "min_score": 1e400}', "min_score: Input should be a finite number"),
        (b'{"query": "x", "k": 1e400}', "k: Input should be a valid integer"),
        (b'{"query": "x", "weights": {"dense": Infinity}}', "weights.dense: Input should be a finite"),
        (b'{"query": "x", "filters": {"meta": {"year": NaN}}}', "filters.meta.year"),
        (b'{"query": "\\ud800 tides"}', "query: "),
        (b'{"texts": ["ok", "\\udfff"]}', "texts.1: "),
        (b'{"query": "x", "filters": {"meta": {"\\ud800": "v"}}}', "filters.meta."),
        (b'{"query": "x", "filters": {"path": ["\\ud800"]}}', "filters.path.0: "),
        (b'{"query": "x", "filters": {"ext": "\\ud800"}}', "filters.ext.0: "),
    ],
)
def test_numbers_and_text_json_carries_but_no_index_can_use_get_422(client, raw, message):
    path = "/embed" if b"texts" in raw else "/search"
    response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith(message) and ("finite" in detail or "valid" in detail), detail


def test_filters_past_what_sqlite_takes_get_422(client):
    for filters in (
        {"path": [f"dir{i}/*" for i in range(5000)]},
        {"meta": {"tag": [f"t{i}" for i in range(5000)]}},
        {"meta": {f"key{i}": "v" for i in range(500)}},
    ):
        response = client.post("/search", json={"query": "tides", "filters": filters})
        assert response.status_code == 422 and "at most 100 are allowed" in response.json()["detail"]


def test_bodies_are_bounded_and_never_echoed(index):
    client = TestClient(create_app(index, max_body_bytes=100_000), base_url="http://localhost")
    big = client.post("/search", json={"query": "tides " * 50_000})
    assert big.status_code == 413 and big.json() == {"detail": "request body larger than 100000 bytes"}

    def chunks():  # no Content-Length: the bound holds on the bytes as they arrive
        yield b'{"query": "'
        for _ in range(1000):
            yield b"tides " * 100
        yield b'"}'

    streamed = client.post("/search", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    long_query = client.post(
        "/search", json={"query": "x" * 30_000}
    )  # under the body bound, over the field's
    assert long_query.status_code == 422 and len(long_query.content) < 1000
    assert client.post("/search", json={"query": "tides", "k": 2}).status_code == 200


@pytest.mark.parametrize(
    ("options", "embedded"),
    [({"mode": "dense"}, True), ({"mode": "hybrid", "weights": {"dense": 0, "lexical": 1}}, False)],
)
def test_concurrent_searches_share_forward_passes(index, options, embedded):
    """Queued searches are embedded together: fewer forwards than requests, same answers (the same
    hits; scores to 1e-5, as a row in a padded batch rounds unlike a row alone: on an AVX2-only
    CPU one score rounded to 0.26479 alone and to 0.264789 batched); and not at all where they do not
    read the vectors (a hybrid search that weighs them 0)."""
    queries = ["ships and rocks", "compost heap", "espresso grind", "tides and the moon"] * 6
    expected = {q: search_result(index, q, k=3, **options) for q in set(queries)}
    forwards = []
    original = index.embed

    def counting(texts, role="query"):
        forwards.append(len(texts))
        return original(texts, role)

    index.embed = counting
    try:
        app = create_app(index)

        async def fire() -> list:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
                return await asyncio.gather(
                    *(http.post("/search", json={"query": q, "k": 3, **options}) for q in queries)
                )

        responses = asyncio.run(fire())
    finally:
        del index.embed
    answered, wanted = [response_result(r) for r in responses], [expected[q] for q in queries]
    assert [[chunk for chunk, _ in hits] for hits in answered] == [[c for c, _ in hits] for hits in wanted]
    np.testing.assert_allclose(
        [score for hits in answered for _, score in hits], [s for hits in wanted for _, s in hits], atol=1e-5
    )
    if embedded:
        assert sum(forwards) == len(queries) and len(forwards) < len(queries) / 2, forwards
    else:
        assert forwards == []


def test_a_body_that_is_not_json_is_422(client):
    response = client.post("/search", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"]


def test_concurrent_requests_get_the_answers_of_sequential_ones(app, index):
    queries = [
        "ships and rocks",
        "compost heap",
        "espresso grind",
        "tides and the moon",
        "git rebase",
        "refund",
    ]
    expected = {q: search_result(index, q, k=3) for q in queries}
    expected_vectors = index.embed(queries, "query")

    async def fire() -> list:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            searches = [http.post("/search", json={"query": q, "k": 3}) for q in queries * 4]
            embeds = [http.post("/embed", json={"texts": [q]}) for q in queries * 2]
            return await asyncio.gather(*searches, *embeds)

    responses = asyncio.run(fire())
    searches, embeds = responses[: len(queries) * 4], responses[len(queries) * 4 :]
    for query, response in zip(queries * 4, searches, strict=True):
        assert response_result(response) == expected[query]
    for row, response in zip(list(range(len(queries))) * 2, embeds, strict=True):
        np.testing.assert_allclose(response.json()["vectors"][0], expected_vectors[row], atol=1e-5)


def test_the_model_runs_on_the_schedulers_thread_alone(index, index_threads):
    """Requests are answered on the server's threads; every use of the model (every embedding,
    the searches' and the routes' own) runs on the thread of the scheduler the app was given,
    and a keyword search runs where it was asked, never on that thread."""
    used = index_threads("embed", "search")
    scheduler = Scheduler()
    client = TestClient(create_app(index, scheduler=scheduler), base_url="http://localhost")
    model = client.get("/v1/models").json()["data"][0]["id"]
    answers = [
        client.post("/search", json={"query": "compost heap", "k": 2}),
        client.post("/embed", json={"texts": ["compost"]}),
        client.post("/v1/embeddings", json={"input": "compost", "model": model}),
        client.post("/context", json={"query": "compost heap", "max_tokens": 60}),
        client.get("/health"),
        client.get("/info"),
    ]
    assert [answer.status_code for answer in answers] == [200] * len(answers)
    with scheduler.job("test", "thread") as job:
        model_thread = scheduler.run(job, threading.get_ident)
    assert used["embed"] == {model_thread}, used
    used["search"].clear()
    assert client.get("/search", params={"q": "tides", "k": 2, "mode": "lexical"}).status_code == 200
    assert used["search"] and model_thread not in used["search"]
    used["embed"].clear()
    refused = client.post("/search", json={"query": "   "})  # refused by Index.search, no model asked
    assert refused.status_code == 422 and refused.json()["detail"] == "the query is empty"
    assert not used["embed"]


def test_the_search_page_is_served_without_a_build_step(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<form id="search-form">' in page.text and 'fetch("/search"' in page.text


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, timeout: float = 120.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_ragidx_serve_binds_loopback_by_default(index):
    port = free_port()
    process = subprocess.Popen(
        [RAGIDX, "serve", "--index", str(index.reader.directory), "--port", str(port), "--device", "cpu"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"
        hits = httpx.post(f"http://127.0.0.1:{port}/search", json={"query": "compost", "k": 2}).json()["hits"]
        assert [h["chunk_id"] for h in hits] == [h.chunk_id for h in index.search("compost", k=2)]
        listening = [c for c in psutil_connections(process.pid) if c.status == "LISTEN"]
        assert [c.laddr.ip for c in listening] == ["127.0.0.1"]
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert f"on http://127.0.0.1:{port}/" in err and "warning" not in err


def psutil_connections(pid: int) -> list:
    import psutil

    return psutil.Process(pid).net_connections(kind="inet")


@pytest.fixture
def live_server(app):
    """The app on a real socket, in a thread of this process."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}"
    wait_for(url + "/health")
    yield url
    server.should_exit = True
    thread.join(timeout=10)


def chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.mark.skipif(chromium() is None, reason="no chromium/chromedriver could be installed here")
def test_a_search_from_the_page_shows_results_in_a_headless_browser(live_server, index):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    try:
        driver.get(live_server + "/")
        driver.find_element(By.ID, "query").send_keys("forgot password")
        Select(driver.find_element(By.ID, "mode")).select_by_value("lexical")
        k = driver.find_element(By.ID, "k")
        k.clear()
        k.send_keys("3")
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "li.hit"))
        shown = [
            item.find_element(By.CSS_SELECTOR, ".path").text.rsplit(":", 1)[0]
            for item in driver.find_elements(By.CSS_SELECTOR, "li.hit")
        ]
        assert shown == [h.path for h in index.search("forgot password", k=3, mode="lexical")]
        marks = [m.text.lower() for m in driver.find_elements(By.CSS_SELECTOR, "li.hit mark")]
        assert marks and set(marks) <= {"forgot", "password", "passwords", "forgotten"}
        assert "results in" in driver.find_element(By.ID, "status").text
    finally:
        driver.quit()


def test_serve_without_an_index_is_a_one_line_error(tmp_path):
    result = subprocess.run(
        [RAGIDX, "serve", "--index", str(tmp_path / "none")], env=child_env(), capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stderr.strip().startswith("error: no index at")
    assert Path(tmp_path / "none").exists() is False
