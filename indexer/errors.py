"""The exception types whose message is shown to users as-is."""


class RagidxError(Exception):
    """A problem the user can fix; the CLI prints its message on one line, without a traceback."""


class IndexLocked(RagidxError):
    """Another build holds the index's write lock; trying again later can succeed."""


class Cancelled(RagidxError):
    """A job's client went away: its work was stopped (by the scheduler, or a chat answer's reader)."""

    def __init__(self) -> None:
        super().__init__("cancelled: the client went away")
