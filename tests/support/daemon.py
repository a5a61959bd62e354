"""Looking at daemons from tests: their sockets, and whether a process still lives."""

from __future__ import annotations

import os
from pathlib import Path


def sockets(env: dict[str, str]) -> list[Path]:
    """The daemon sockets in the private folder of ``env`` (see conftest's ``daemon_env``)."""
    return sorted((Path(env["XDG_RUNTIME_DIR"]) / "ragidx").glob("*.sock"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat_file:  # a zombie (ended, not yet reaped) is not alive
        return stat_file.read().split()[2] != "Z"
