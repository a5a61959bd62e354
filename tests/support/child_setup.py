"""What a test's child process sets up before it runs a command: limits, signals, dropped powers.

``subprocess``'s ``preexec_fn`` would do it between fork and exec, in a copy of the test process
that has only the forking thread; where the test process runs threads (gRPC's from pymilvus, Ray's,
torch's), a lock one of them held stays held, and the child can hang before exec. So a fresh Python
does it here and execs the command: :func:`prepared` gives the command line. Nothing heavy is
imported, so it costs one bare interpreter start.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import Path

MEMORY_LIMIT = 4 * 2**30  # address space of a bounded child: a tiny-model build peaks near 2 GB
FILE_LIMIT = 10 << 20  # bytes a file may grow to in a child told the disk is full past it
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def prepared(setup: Callable[[], None], command: list[str | Path]) -> list[str]:
    """The command line that runs ``command`` after ``setup`` (a function of this module): this
    file run as a script (see the end of it)."""
    return [sys.executable, __file__, setup.__name__, *map(str, command)]


def interruptible() -> None:
    """SIGINT ends it, as from a terminal: a shell without job control starts background jobs with
    SIGINT ignored, and a pytest started that way would hand the command that deafness."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def small_disk() -> None:
    """Writes past :data:`FILE_LIMIT` fail with EFBIG (as on a full disk) instead of killing it."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def without_root_powers() -> None:
    """Drop the capabilities that let root read any folder, so file permissions hold for it as for
    any user (a no-op for other users, who have none)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


if __name__ == "__main__":  # python child_setup.py SETUP COMMAND...: SETUP(), then exec COMMAND
    globals()[sys.argv[1]]()
    os.execvp(sys.argv[2], sys.argv[2:])
