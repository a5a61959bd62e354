"""How commands print: JSON, search hits and passages, skipped files, reports, paths."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ragidx.app import RagidxError
from ragidx.indexer.wording import counted, page_label, printable_text, shown


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2))


class OutputClosed(Exception):
    """The reader of stdout went away (``ragidx query ... | head -1``): the output is no longer wanted."""


def print_skipped(skipped: Sequence[Any]) -> None:
    if skipped:
        click.echo(f"skipped {counted(len(skipped), 'path')}:")
        for item in skipped:
            click.echo(f"  {display_path(item.path)}: {item.reason}")


def print_sources(found: dict[str, Any]) -> None:
    """After an answer: the passages it cites, each with its place and title."""
    click.echo()
    if found["citations"]:
        click.echo("\nSources:")
    for cited in found["citations"]:
        start, end = cited["span"]
        place = " ".join(
            filter(None, (f"{display_path(cited['path'])}:{start}-{end}", page_label(cited["pages"])))
        )
        click.echo(f"[{cited['number']}] {place}  {printable_text(cited['title'])}")


def print_hits(hits: list[Any]) -> None:
    """Rank, score, place and title, then the snippet; query words in bold colour on a terminal."""
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    if not hits:
        click.echo("no results", err=True)
    for hit in hits:
        start, end = hit.span
        place = " ".join(filter(None, (f"{display_path(hit.path)}:{start}-{end}", page_label(hit.pages))))
        header = f"{hit.rank:>2}  {hit.score:.4f}  {place}  {printable_text(hit.title)}"
        click.echo(click.style(header, bold=True) if color else header, color=color)
        highlight = (lambda w: click.style(w, fg="yellow", bold=True)) if color else str
        click.echo(f"    {hit.snippet.render(highlight, printable_text)}", color=color)
        if hit.explain is not None:
            click.echo(f"    why: {hit.explain.describe()}")


def write_report_json(report: Any, target: str | None) -> bool:
    """Write ``report`` as JSON where ``--json`` says; True when it went to stdout (no table then)."""
    if target is None:
        return False
    text = json.dumps(report.to_dict(), indent=2, ensure_ascii=False)
    if target == "-":
        click.echo(text)
        return True
    try:
        Path(target).write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise RagidxError(f"cannot write the report to {target}: {error.strerror or error}") from None
    return False


def display_path(path: str) -> str:
    """Paths under the working directory are shown relative to it, control characters escaped
    (a file name may hold a terminal escape sequence)."""
    try:
        return shown(os.path.relpath(path) if Path(path).is_relative_to(Path.cwd()) else path)
    except ValueError:
        return shown(path)


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail on a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
