"""What BM25 sees: each chunk's terms in its document's language, and the query's in its own.

FTS5's tokenizers read one language: ``porter unicode61`` stems English and splits on spaces, so a
Chinese or Japanese sentence is one token and a German word keeps its inflection. ragidx therefore
analyses the text itself and writes the terms into its own FTS5 table (:data:`TERMS_TABLE`, whose
tokenizer only splits on the spaces it put there):

- words of a spaced language are lower-cased, stemmed by Snowball for the document's language
  (English: Porter, what FTS5's ``porter`` did) and stripped of accents;
- runs of Han, kana and Hangul become overlapping character bigrams (a lone character stays one),
  what Lucene's CJK analyzer and Elasticsearch's ``cjk_bigram`` index, so a question in plain
  sentences matches the words it shares with a page without a dictionary of words.

A query is analysed the same way in its own language, told among the index's languages; its
stop words are left out unless it has nothing else. Indexes written before languages keep
``chunks_fts`` (English) until their next build rebuilds the terms (:func:`create_terms_table`).
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ragidx.indexer.ingest.languages import (
    ENGLISH,
    ENGLISH_STEMMER,
    detect,
    stemmer,
    stemmer_name,
    stop_words,
)

if TYPE_CHECKING:
    from sqlite_utils import Database

TERMS_TABLE = "chunks_terms"
LEGACY_TABLE = "chunks_fts"  # an index written before languages: English words, porter stems
LEGACY_CJK_TABLE = "chunks_cjk"
LEGACY_TRIGGERS = ("chunks_ai", "chunks_ad", "chunks_au")  # sqlite-utils' names for chunks_fts's
# Han (with extension A and compatibility ideographs), hiragana, katakana (not its middle dot,
# punctuation) and Hangul syllables. Patterns, not compiled ones: compiling these ranges costs
# 3 ms, which every `ragidx query` client would pay at import; ``re`` compiles them at first use.
CJK_RANGES = "\u3041-\u309f\u30a0-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
CJK = f"[{CJK_RANGES}]"
CJK_RUN = f"{CJK}+"
HIRAGANA = "[\u3041-\u309f]"
# What unicode61 calls a token (letters and digits; underscores part them), CJK characters apart.
WORD = f"[^\\W_{CJK_RANGES}]+"
# Capitalised words in a row that stand for an acronym: three, as in "JSON Web Tokens" or
# "Server-Sent Events"; two would read "Map Python" in "Map Python classes" as one.
ACRONYM_WORDS = 3


def bigrams(run: str) -> list[str]:
    """The overlapping character pairs of a run of CJK characters (a lone character itself)."""
    return [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]


@functools.lru_cache(maxsize=1 << 18)
def stem(word: str, language: str) -> str:
    """``word`` (lower case) stemmed for ``language``, then stripped of accents, as unicode61's
    ``remove_diacritics`` does; English words (and those of a language Snowball does not stem) by
    FTS5's own ``porter unicode61``, so English is searched exactly as before languages."""
    if stemmer_name(language) == ENGLISH_STEMMER:
        return _porter_stem(word)
    stemmed = stemmer(language).stemWord(word)
    decomposed = unicodedata.normalize("NFKD", stemmed)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@functools.cache
def _porter_table() -> sqlite3.Connection:
    """An in-memory FTS5 table whose vocabulary reads back what ``porter unicode61`` made of a
    word (SQLite's Porter differs from Snowball's: it leaves words under three letters alone)."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    connection.execute("create virtual table porter using fts5(word, tokenize='porter unicode61')")
    connection.execute("create virtual table porter_terms using fts5vocab(porter, 'instance')")
    return connection


_PORTER_LOCK = threading.Lock()


def _porter_stem(word: str) -> str:
    with _PORTER_LOCK:
        connection = _porter_table()
        connection.execute("insert into porter (rowid, word) values (1, ?)", [word])
        found = connection.execute("select term from porter_terms").fetchone()
        connection.execute("delete from porter where rowid = 1")
    return str(found[0]) if found else word


def _parts(text: str) -> tuple[list[str], list[str]]:
    """The CJK runs and the other words of ``text``, compatibility forms folded (full-width
    letters, half-width katakana) and words lower-cased."""
    folded = unicodedata.normalize("NFKC", text)
    runs = re.findall(CJK_RUN, folded)
    words = re.findall(WORD, re.sub(CJK_RUN, " ", folded).lower())
    return runs, words


def terms(text: str, language: str) -> str:
    """What :data:`TERMS_TABLE` indexes for a chunk of ``text`` in ``language``: its stemmed
    words and CJK bigrams, parted by spaces."""
    runs, words = _parts(text)
    return " ".join([*(stem(w, language) for w in words), *(b for run in runs for b in bigrams(run))])


def query_terms(query: str, language: str) -> list[str]:
    """The query's terms for ``language``: stop words left out unless nothing else is left, and
    CJK bigrams that are stop words or hold a one-character hiragana stop word (a particle:
    "ファイルの中" reads ``ファ ァイ イル``) likewise; then each word, and each of the
    :func:`acronyms` of its capitalised phrases, stemmed. Two words with one stem stay two terms,
    as FTS5 read them before languages (BM25 counts each)."""
    stops = stop_words(language)
    runs, words = _parts(query)
    pairs = list(dict.fromkeys(b for run in runs for b in bigrams(run)))
    particles = {w for w in stops if len(w) == 1 and re.fullmatch(HIRAGANA, w)}
    content_pairs = [p for p in pairs if p not in stops and not particles & set(p)]
    unique = list(dict.fromkeys(words))
    content_words = [w for w in unique if w not in stops]
    if not content_words and not content_pairs:
        content_words, content_pairs = unique, pairs
    spelled = dict.fromkeys([*content_words, *acronyms(query)])
    stems = [stemmed for word in spelled if (stemmed := stem(word, language))]  # never an empty phrase
    return [*stems, *content_pairs]


def query_language(query: str, languages: Mapping[str, int]) -> str:
    """The language to analyse ``query`` in: the index's only one, else the likeliest of its
    ``languages`` (chunks in each: the shares weigh the detector's odds; English for an index
    that names none: one written before languages)."""
    return detect(query, languages) if languages else ENGLISH


def match_expression(query: str, language: str = ENGLISH) -> str | None:
    """The MATCH expression of ``query`` in ``language`` for :data:`TERMS_TABLE`, or None when it
    has no terms.

    Every term is quoted (FTS5 syntax in user text is matched as plain words) and the terms are
    OR-ed, as BM25 ranking expects.
    """
    return " OR ".join(f'"{term}"' for term in query_terms(query, language)) or None


def legacy_match_expression(query: str) -> str | None:
    """The MATCH expression for :data:`LEGACY_TABLE` (its porter tokenizer stems the words)."""
    words = list(dict.fromkeys(w.lower() for w in re.findall(WORD, query)))
    content = [w for w in words if w not in stop_words()] or words
    return " OR ".join(f'"{term}"' for term in dict.fromkeys([*content, *acronyms(query)])) or None


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


def document_language(texts: Iterable[str]) -> str:
    """The language of a document, told from its first chunks' text."""
    return detect(" ".join(texts))


def create_terms_table(db: Database) -> None:
    """Create :data:`TERMS_TABLE` if missing, filled from the chunks already indexed (an index
    written before languages), and drop the tables it replaces; one transaction, so a kill
    mid-way leaves the index as it was."""
    if db[TERMS_TABLE].exists():
        return
    with db.atomic():
        db.execute(
            f"create virtual table {TERMS_TABLE} using fts5(terms, language unindexed, "
            "tokenize='unicode61 remove_diacritics 0')"
        )
        fill_terms_table(db)
        for trigger in LEGACY_TRIGGERS:
            db.execute(f"drop trigger if exists {trigger}")
        db.execute(f"drop table if exists {LEGACY_TABLE}")
        db.execute(f"drop table if exists {LEGACY_CJK_TABLE}")


def fill_terms_table(db: Database) -> None:
    """Index every chunk, each document's in its language (after a ``delete``: a repair)."""
    rows = db.execute("select document_id, id, text from chunks order by document_id, ordinal").fetchall()
    documents: dict[int, list[tuple[int, str]]] = {}
    for document_id, chunk_id, text in rows:
        documents.setdefault(document_id, []).append((chunk_id, text))
    for chunks in documents.values():
        add_document_terms(db, chunks)


def add_document_terms(db: Database, chunks: Sequence[tuple[int, str]]) -> None:
    """Write one document's chunks (id, text) in the language told from them."""
    if not chunks:
        return
    language = document_language(text for _, text in chunks[:4])
    db.conn.executemany(
        f"insert into {TERMS_TABLE} (rowid, terms, language) values (?, ?, ?)",
        ((chunk_id, terms(text, language), language) for chunk_id, text in chunks),
    )


def remove_terms_rows(db: Database, chunk_ids: Iterable[int]) -> None:
    db.conn.executemany(f"delete from {TERMS_TABLE} where rowid = ?", ((int(i),) for i in chunk_ids))


def chunk_languages(db: Database) -> dict[str, int]:
    """Chunks per language, most first (empty for an index written before languages)."""
    if not db[TERMS_TABLE].exists():
        return {}
    rows = db.execute(
        f"select language, count(*) from {TERMS_TABLE} group by language order by 2 desc, 1"
    ).fetchall()
    return {str(language): int(count) for language, count in rows}


def rewrite_chunk_text(db: Database, chunk_id: int, text: str) -> None:
    """Change a chunk's text and its terms (in the language its document was told in)."""
    db.execute("update chunks set text = ? where id = ?", [text, chunk_id])
    row = db.execute(f"select language from {TERMS_TABLE} where rowid = ?", [chunk_id]).fetchone()
    if row is not None:
        db.execute(f"update {TERMS_TABLE} set terms = ? where rowid = ?", [terms(text, row[0]), chunk_id])
