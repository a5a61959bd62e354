"""The MCP transport (``ragidx mcp``): the tools an agent calls and the stdio loop they run in."""
