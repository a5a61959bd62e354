"""The MCP SDK's own stdio client against ``ragidx mcp`` (only where the mcp extra is installed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.cli import RAGIDX, child_env


def session(index: Path, script) -> dict:
    """Run ``script(client)`` against ``ragidx mcp --index INDEX`` and return what it collected."""
    import mcp
    from mcp.client.stdio import StdioServerParameters

    async def main() -> dict:
        server = StdioServerParameters(command=RAGIDX, args=["mcp", "--index", str(index)], env=child_env())
        async with mcp.Client(server, read_timeout_seconds=120) as client:
            return await script(client)

    return asyncio.run(main())
