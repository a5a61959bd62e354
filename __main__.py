"""``python -m ragidx`` and the ``ragidx`` console script: a query or a question goes to the
command server beside the daemon (:mod:`ragidx.app.daemon.launcher`) without importing the CLI; anything
else, or when no server answers, runs the CLI (:func:`ragidx.cli.main`) in this process."""

from __future__ import annotations

import sys

from ragidx.app.daemon import launcher


def main() -> None:
    """Run ``ragidx`` with this process's arguments; exits with the command's status."""
    argv = sys.argv[1:]
    status = launcher.forwarded(argv) if launcher.forwardable(argv) else None
    if status is None:
        from ragidx.cli import main as run_here

        run_here(argv)
    sys.exit(status)


if __name__ == "__main__":
    main()
