"""Which files ragidx may open, and opening them safely.

A build, and a server reading an indexed document again, open only regular files whose real path
lies inside the folders (or files) the index was built from, no larger than a limit. So a link
planted in the corpus (``notes/p.md -> /etc/passwd``), an indexed file swapped for such a link
later, a FIFO that would block forever and ``/dev/zero`` that would fill memory are each skipped
with a reason instead. The check resolves the path, then opens the resolved path without
following a link (``O_NOFOLLOW``, so a link swapped in meanwhile fails) and without blocking
(``O_NONBLOCK``, for a FIFO), and decides from ``fstat`` of what was actually opened.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# What a 2-core laptop embeds in hours (docs/command-line.md, "What is never read").
DEFAULT_MAX_FILE_BYTES = 64 * 2**20
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
READ_BLOCK = 2**20
SPECIAL_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def under(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one of them (absolute path strings)."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


@dataclass(frozen=True)
class Opened:
    """A file's bytes as read, with its size and modification time."""

    data: bytes
    size: int
    mtime: float


@dataclass(frozen=True)
class FileAccess:
    """Regular files whose real path is inside one of ``roots`` (real paths), up to ``max_bytes``."""

    roots: tuple[str, ...]
    max_bytes: int = DEFAULT_MAX_FILE_BYTES

    @classmethod
    def under(cls, paths: Iterable[str | Path], max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> FileAccess:
        """Access to what ``paths`` (files or folders, as given to a build) hold."""
        return cls(tuple(sorted({os.path.realpath(path) for path in paths})), max_bytes)

    def read(self, path: str | Path) -> Opened | str:
        """The file's bytes, or why it is not read (a reason for the skip report)."""
        real = os.path.realpath(path)
        if not under(real, self.roots):
            return "a link to outside the indexed folders: not followed"
        try:
            fd = os.open(real, OPEN_FLAGS)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return "replaced by a link while being read: not followed"
            return f"unreadable: {error.strerror or error}"
        try:
            found = os.fstat(fd)
            kind = next((name for test, name in SPECIAL_KINDS if test(found.st_mode)), None)
            if kind or not stat.S_ISREG(found.st_mode):
                return f"not a regular file ({kind or 'special'})"
            if found.st_size > self.max_bytes:
                return self._too_large(found.st_size)
            data = _read_at_most(fd, self.max_bytes + 1)
        except OSError as error:
            return f"unreadable: {error.strerror or error}"
        finally:
            os.close(fd)
        if len(data) > self.max_bytes:  # it grew while being read
            return self._too_large(len(data))
        return Opened(data, len(data), found.st_mtime)

    def _too_large(self, size: int) -> str:
        return f"larger than {_megabytes(self.max_bytes)} ({_megabytes(size)}; raise it with --max-file-mb)"


def _read_at_most(fd: int, limit: int) -> bytes:
    blocks = []
    total = 0
    while total < limit:
        block = os.read(fd, min(READ_BLOCK, limit - total))
        if not block:
            break
        blocks.append(block)
        total += len(block)
    return b"".join(blocks)


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MB"
