"""What an incremental build has to do: compare the scanned sources with the index by content hash."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ragidx.indexer.ingest.access import under
from ragidx.indexer.ingest.sources import ScanResult, SourceDocument, normal_path


@dataclass
class ChangePlan:
    """``new`` and ``updated`` documents get embedded; ``stale`` ids (old versions of updated
    documents and documents gone from disk) get deleted; the rest stays as it is."""

    new: list[SourceDocument] = field(default_factory=list)
    updated: list[SourceDocument] = field(default_factory=list)
    unchanged: int = 0
    removed: int = 0
    stale: list[int] = field(default_factory=list)

    @property
    def to_embed(self) -> list[SourceDocument]:
        return self.new + self.updated

    @property
    def changes_anything(self) -> bool:
        return bool(self.new or self.updated or self.stale)

    def summary(self) -> str:
        counts = (len(self.new), len(self.updated), self.unchanged, self.removed)
        return "{} new, {} updated, {} unchanged, {} removed".format(*counts)


def absolute_roots(paths: Sequence[str | Path]) -> list[str]:
    """Each path as the index stores it, and as an index written before paths were normalised did."""
    return list(dict.fromkeys(form for p in paths for form in (normal_path(p), str(Path(p).absolute()))))


def plan_changes(
    scanned: ScanResult, indexed: Mapping[str, tuple[int, str]], roots: Sequence[str | Path]
) -> ChangePlan:
    """Diff by path and SHA-256. Only documents under the build's ``roots`` can be removed, and a
    file or folder that still exists but could not be read this time keeps its indexed version."""
    plan = ChangePlan()
    seen = set()
    for document in scanned.documents:
        seen.add(document.path)
        previous = indexed.get(document.path)
        if previous is None:
            plan.new.append(document)
        elif previous[1] != document.content_hash:
            plan.updated.append(document)
            plan.stale.append(previous[0])
        else:
            plan.unchanged += 1
    kept = seen | {s.path for s in scanned.skipped}
    unlisted = [s.path for s in scanned.skipped if s.folder]
    within = absolute_roots(roots)
    for path, (document_id, _) in indexed.items():
        if path not in kept and under(path, within) and not under(path, unlisted):
            plan.removed += 1
            plan.stale.append(document_id)
    return plan
