"""Where ragidx keeps what it computes once per model (calibrations, converted GGUF models)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_dir() -> Path:
    """``$RAGIDX_CACHE_DIR`` or the platform's user cache directory for ragidx."""
    return Path(os.environ.get("RAGIDX_CACHE_DIR") or user_cache_dir("ragidx"))
