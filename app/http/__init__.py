"""The HTTP transport (``ragidx serve``): the FastAPI app, its OpenAI-compatible routes, requests as
scheduler jobs and the server's bounds on connections and bodies."""
