"""A loopback OpenAI-compatible chat endpoint that misbehaves on purpose, and says when its client
closed the request: what ragidx must survive from a real one (a hung server, an endless stream)."""

from __future__ import annotations

import json
import select
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD = "word "


def event(content: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": {"content": content}}]}).encode() + b"\n\n"


class FakeChat:
    """Serves ``POST /v1/chat/completions`` on 127.0.0.1 in one of four ways: ``endless`` (a piece
    every ``delay`` seconds, never done), ``hang`` (headers, then silence), ``pieces`` (``count``
    pieces, then ``[DONE]``) or ``raw`` (``body`` with ``status`` and ``content_type``, then the
    connection closed). :attr:`opened` is set once a request arrives, :attr:`closed` (with
    :attr:`closed_at`) once its client has closed the connection."""

    def __init__(
        self,
        mode: str = "endless",
        delay: float = 0.05,
        count: int = 5,
        body: bytes = b"",
        status: int = 200,
        content_type: str = "text/event-stream",
    ):
        self.mode, self.delay, self.count = mode, delay, count
        self.body, self.status, self.content_type = body, status, content_type
        self.opened = threading.Event()
        self.closed = threading.Event()
        self.closed_at: float | None = None
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                fake.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(fake.status)
                self.send_header("Content-Type", fake.content_type)
                self.end_headers()
                fake.opened.set()
                try:
                    fake.answer(self)
                except OSError:
                    fake.gone()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        if self.mode == "raw":  # ``body`` as it is, then the connection closes
            handler.wfile.write(self.body)
            return
        if self.mode == "pieces":
            for _ in range(self.count):
                handler.wfile.write(event(WORD))
                handler.wfile.flush()
                time.sleep(self.delay)
            handler.wfile.write(b"data: [DONE]\n\n")
            return
        while True:
            if self.mode == "endless":
                handler.wfile.write(event(WORD))
                handler.wfile.flush()
            readable = select.select([handler.connection], [], [], self.delay)[0]
            if readable and not handler.connection.recv(1):  # the client closed its end
                self.gone()
                return

    def gone(self) -> None:
        if not self.closed.is_set():
            self.closed_at = time.monotonic()
            self.closed.set()

    def __enter__(self) -> FakeChat:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
