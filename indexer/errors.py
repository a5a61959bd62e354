"""The one exception type whose message is shown to users as-is."""


class RagidxError(Exception):
    """A problem the user can fix; the CLI prints its message on one line, without a traceback."""


class IndexLocked(RagidxError):
    """Another build holds the index's write lock; trying again later can succeed."""
