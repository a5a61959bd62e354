"""Where an index lives: its folder (``--index``, ``$RAGIDX_INDEX``, ``./.ragidx``) and the file
names in it. Nothing here opens anything, so the CLI can name an index cheaply."""

from __future__ import annotations

import os
from pathlib import Path

from ragidx.indexer.errors import RagidxError

DB_NAME = "ragidx.db"
LOCK_NAME = "build.lock"
JOURNAL_NAME = "resume.db"  # vectors of a build that has not committed yet (indexer.build.journal)
DEFAULT_INDEX_DIR = ".ragidx"


def default_index_dir() -> Path:
    """``$RAGIDX_INDEX`` or ``./.ragidx``."""
    return Path(os.environ.get("RAGIDX_INDEX") or DEFAULT_INDEX_DIR)


def no_index(directory: Path) -> RagidxError:
    """The one error for a folder holding no committed index (none yet, a first build running, or
    one interrupted, whose journal the next build resumes from)."""
    if (Path(directory) / JOURNAL_NAME).is_file():
        return RagidxError(
            f"no index at {directory}: its first build has not completed; what it embedded is kept "
            f"({JOURNAL_NAME}), and the same `ragidx build` resumes from it if it was interrupted"
        )
    return RagidxError(
        f"no index at {directory}: no build has completed there "
        "(run `ragidx build PATH` first, or pass --index DIR)"
    )


def index_exists(directory: str | Path) -> bool:
    """Whether ``directory`` holds an index database (committed or not)."""
    return (Path(directory) / DB_NAME).is_file()
