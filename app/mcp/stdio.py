"""MCP over stdio where every message gets an answer.

The ``mcp`` SDK's stdio transport (2.x) drops a line it cannot parse or validate without a word,
so a client that sent bad JSON, a lone surrogate, ``[]``, ``null`` or a batch waits forever.
This transport sits in front of it: each line is checked first, a malformed one is answered at
once with a JSON-RPC error (``-32700`` parse error, ``-32600`` invalid request; the message
short, never the input echoed), and only well-formed messages reach the SDK. As the SDK's own
transport does, it keeps the protocol's descriptors to itself: while serving, fd 0 reads from
the null device and fd 1 points at stderr, so stray output from libraries cannot corrupt the wire.
End of input ends the server.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any, BinaryIO

import anyio
import mcp_types as types
from anyio import to_thread
from mcp.server.stdio import stdio_server

from ragidx.indexer.wording import encodable

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
MAX_LINE_BYTES = 16 * 2**20  # a longer line is refused unread: no index needs a 16 MB request


class Wire:
    """The protocol's stdin and stdout, held privately (see the module)."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO):
        self.reader = reader
        self.writer = writer
        self.lock = anyio.Lock()

    async def write(self, text: str) -> None:
        """One whole message line, written and flushed under a lock (replies to malformed input
        and the SDK's messages share the wire)."""
        async with self.lock:
            await to_thread.run_sync(self._write, text)

    def _write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))
        self.writer.flush()

    async def flush(self) -> None:
        """Each write flushes already (the SDK calls this after each message)."""

    async def lines(self) -> AsyncIterator[str]:
        """Well-formed message lines; malformed ones are answered here and left out."""
        while line := await to_thread.run_sync(self._read_line):
            text = line.decode("utf-8", "replace").strip()
            if not text:
                continue
            refusal = malformed(text) if len(line) <= MAX_LINE_BYTES else (None, INVALID_REQUEST, "too long")
            if refusal is None:
                yield text
                continue
            request_id, code, reason = refusal
            if request_id is not _NOTIFICATION:
                await self.write(error_line(request_id, code, reason))

    def _read_line(self) -> bytes:
        line = self.reader.readline(MAX_LINE_BYTES + 1)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := self.reader.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass  # the rest of the over-long line, dropped
        return line


_NOTIFICATION = object()  # a malformed notification: JSON-RPC says nothing is sent back


def malformed(text: str) -> tuple[Any, int, str] | None:
    """None for a well-formed message; else the id to answer (None where unknown), the error code
    and a short reason."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None, PARSE_ERROR, "Parse error: not JSON"
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, dict | list | bool | float):
        request_id = None
    if not _encodable(data):
        return request_id, PARSE_ERROR, "Parse error: text is not valid Unicode (a lone surrogate)"
    if not isinstance(data, dict):
        what = "a batch" if isinstance(data, list) else "not an object"
        return None, INVALID_REQUEST, f"Invalid Request: {what} (send one JSON-RPC message per line)"
    try:
        types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except Exception:
        if "id" not in data and "method" in data:
            return _NOTIFICATION, INVALID_REQUEST, ""
        return (
            request_id,
            INVALID_REQUEST,
            "Invalid Request: not a JSON-RPC 2.0 request, notification or response",
        )
    return None


def _encodable(value: Any) -> bool:
    """Whether every string in a parsed message (keys included) is valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and not encodable(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def error_line(request_id: Any, code: int, message: str) -> str:
    return (
        json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}) + "\n"
    )


@contextlib.contextmanager
def claimed_wire() -> Iterator[Wire]:
    """The process's stdin and stdout as the protocol's own; fd 0 and 1 diverted meanwhile."""
    reader = os.fdopen(os.dup(0), "rb")
    writer = os.fdopen(os.dup(1), "wb")
    saved = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    try:
        yield Wire(reader, writer)
    finally:
        for fd, original in zip((0, 1), saved, strict=True):
            os.dup2(original, fd)
            os.close(original)
        reader.close()
        writer.close()


async def serve(server: Any) -> None:
    """Run ``server`` (an ``MCPServer``) over the checked wire until its input ends."""
    with claimed_wire() as wire:
        async with stdio_server(stdin=wire.lines(), stdout=wire) as (read_stream, write_stream):  # type: ignore[arg-type]
            lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async runs (mcp 2.x)
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
