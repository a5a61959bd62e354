"""Running the installed ``ragidx`` console script from tests, as a user's shell would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.child_setup import prepared, without_root_powers

RAGIDX = str(Path(sys.executable).parent / "ragidx")


def child_env() -> dict[str, str]:
    """The environment of the moment (conftest points the cache at a temporary folder), offline."""
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def ragidx(
    *args: str | Path, check: bool = True, env: dict[str, str] | None = None, **kwargs
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [RAGIDX, *map(str, args)],
        capture_output=True,
        text=True,
        env={**child_env(), **(env or {})},
        timeout=300,
        **kwargs,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def assert_one_line_error(result: subprocess.CompletedProcess, pattern: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), lines[0]


def ragidx_after(
    setup: Callable[[], None], *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``ragidx ARGS`` after ``setup``, a function of :mod:`tests.support.child_setup`."""
    return subprocess.run(
        prepared(setup, [RAGIDX, *args]),
        capture_output=True,
        text=True,
        env={**child_env(), **(env or {})},
        timeout=300,
    )


def ragidx_powerless(*args: str | Path) -> subprocess.CompletedProcess:
    """``ragidx ARGS`` without the powers that let root read any file (file modes hold for it)."""
    return ragidx_after(without_root_powers, *args)
