"""What BM25 sees: the query's content words, and text in scripts written without spaces.

FTS5's ``porter unicode61`` tokenizer splits on spaces and punctuation, so a Chinese or Japanese
sentence is one token and ``首都`` matches nothing inside ``日本の首都は東京です``. Chunks holding
such text are therefore also written, with each of those characters set apart, into a second,
contentless FTS5 table (``chunks_cjk``); a query with such characters searches it, its runs of
them as phrases, so ``首都`` matches the two characters side by side. (The ``trigram`` tokenizer
cannot match the two-character words these languages are full of.)
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlite_utils import Database

CJK_TABLE = "chunks_cjk"
# Han (with extensions A and compatibility), kana (with half-width katakana) and Hangul syllables.
# Patterns, not compiled ones: compiling these two ranges costs 3 ms, which every `ragidx query`
# client would pay at import; ``re`` compiles and caches them at first use.
CJK = "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]"
CJK_RUN = f"{CJK}+"
WORD = r"\w+"
# Capitalised words in a row that stand for an acronym: three, as in "JSON Web Tokens" or
# "Server-Sent Events"; two would read "Map Python" in "Map Python classes" as one.
ACRONYM_WORDS = 3


@functools.cache
def stop_words() -> frozenset[str]:
    """spaCy's English stop words, read from its list's own file: importing the list the usual way
    imports spaCy (0.75 s), which a lexical query has no other use for."""
    spec = importlib.util.find_spec("spacy")
    folders = list(spec.submodule_search_locations or []) if spec else []
    source = Path(folders[0]) / "lang" / "en" / "stop_words.py" if folders else None
    loader = importlib.util.spec_from_file_location("ragidx_stop_words", source) if source else None
    if loader is None or loader.loader is None:
        from spacy.lang.en.stop_words import STOP_WORDS

        return frozenset(STOP_WORDS)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return frozenset(module.STOP_WORDS)


def has_cjk(text: str) -> bool:
    return re.search(CJK, text) is not None


def cjk_spaced(text: str) -> str:
    """``text`` with every CJK character a word of its own, as the CJK table indexes it."""
    return re.sub(CJK, lambda m: f" {m.group()} ", text)


def match_expression(query: str) -> tuple[str, str] | None:
    """The FTS5 table to search and the MATCH expression for ``query``, or None when it has no words.

    Every word is quoted (FTS5 syntax in user text is matched as plain words) and the words are
    OR-ed, as BM25 ranking expects. Stop words are left out unless the query has nothing else;
    the :func:`acronyms` of its capitalised phrases are added. A query with CJK text searches
    :data:`CJK_TABLE`, each run of CJK characters as one phrase.
    """
    if has_cjk(query):
        phrases = [" ".join(run) for run in re.findall(CJK_RUN, query)]
        words = _content_words(re.findall(WORD, re.sub(CJK_RUN, " ", query)))
        terms = [*phrases, *words, *acronyms(query)]
        return CJK_TABLE, " OR ".join(f'"{term}"' for term in dict.fromkeys(terms))
    words = _content_words(re.findall(WORD, query))
    if not words:
        return None
    terms = [*words, *acronyms(query)]
    return "chunks_fts", " OR ".join(f'"{term}"' for term in dict.fromkeys(terms))


def acronyms(query: str) -> list[str]:
    """The initials of each run of :data:`ACRONYM_WORDS` or more capitalised words, lower-cased
    ("encode JSON Web Tokens" -> ``jwt``): a question spells out what a document often names only
    by its acronym (a README that says ``import jwt`` and never "JSON Web Token"). Words in a run
    are parted by spaces or hyphens; any other mark, a lower-case word, a word with a digit or a
    stop word ends it, so a claim's "In British Men" or "Cnp1 N-tail" makes none."""
    found: list[str] = []
    run: list[str] = []
    for token in [*re.findall(r"\w+|[^\w\s-]", query), "."]:
        if token.isalpha() and token[0].isupper() and token.lower() not in stop_words():
            run.append(token[0])
            continue
        if len(run) >= ACRONYM_WORDS:
            found.append("".join(run).lower())
        run = []
    return found


def _content_words(words: Iterable[str]) -> list[str]:
    lowered = list(dict.fromkeys(word.lower() for word in words))
    return [word for word in lowered if word not in stop_words()] or lowered


def create_cjk_table(db: Database) -> None:
    """Create the CJK table if missing, filled from the chunks already indexed (older indexes)."""
    if db[CJK_TABLE].exists():
        return
    with db.atomic():  # one transaction: the table exists filled, or not at all (a kill mid-way)
        db.execute(
            f"create virtual table {CJK_TABLE} using fts5(text, content='', tokenize='porter unicode61')"
        )
        fill_cjk_table(db)


def fill_cjk_table(db: Database) -> None:
    """Index every chunk holding CJK text (after ``delete-all``: a repair)."""
    rows = db.execute("select id, text from chunks").fetchall()
    add_cjk_rows(db, rows)


def add_cjk_rows(db: Database, rows: Iterable[tuple[int, str]]) -> None:
    db.conn.executemany(
        f"insert into {CJK_TABLE} (rowid, text) values (?, ?)",
        ((chunk_id, cjk_spaced(text)) for chunk_id, text in rows if has_cjk(text)),
    )


def remove_cjk_rows(db: Database, rows: Iterable[tuple[int, str]]) -> None:
    """Take chunks out of the CJK table; a contentless table needs the text it indexed to do so."""
    db.conn.executemany(
        f"insert into {CJK_TABLE} ({CJK_TABLE}, rowid, text) values ('delete', ?, ?)",
        ((chunk_id, cjk_spaced(text)) for chunk_id, text in rows if has_cjk(text)),
    )


def rewrite_chunk_text(db: Database, chunk_id: int, text: str) -> None:
    """Change a chunk's text in both lexical tables (the FTS5 triggers follow ``chunks``)."""
    (old,) = db.execute("select text from chunks where id = ?", [chunk_id]).fetchone()
    db.execute("update chunks set text = ? where id = ?", [text, chunk_id])
    if db[CJK_TABLE].exists():
        remove_cjk_rows(db, [(chunk_id, old)])
        add_cjk_rows(db, [(chunk_id, text)])
