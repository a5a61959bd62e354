"""Named points in the commit protocol where a test can kill the process, to prove crash safety.

``RAGIDX_KILL_AT=faiss-write`` makes a build SIGKILL itself when it reaches that point, exactly
as a power cut or the OOM killer would; ``RAGIDX_INTERRUPT_AT`` sends it SIGINT there, as Ctrl-C
would. Unset (always, outside the crash tests) they cost an environment lookup per commit.
"""

from __future__ import annotations

import os
import signal

KILL_POINTS = ("faiss-write", "faiss-renamed", "sqlite-commit")
MERGE_KILL_POINTS = ("merge-write", "merge-renamed")  # in the background merge's thread
MILVUS_KILL_POINTS = ("milvus-upsert", "milvus-delete")  # before the commit, after it
JOURNAL_KILL_POINT = "journal-saved"  # after a build journalled its first group of vectors


def checkpoint(name: str) -> None:
    """Die here, without cleanup, if ``$RAGIDX_KILL_AT`` names this point; be interrupted (the
    main thread gets KeyboardInterrupt) if ``$RAGIDX_INTERRUPT_AT`` does."""
    if os.environ.get("RAGIDX_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("RAGIDX_INTERRUPT_AT") == name:
        os.kill(os.getpid(), signal.SIGINT)
