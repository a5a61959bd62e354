"""Keyword search in every script: each document's language told and stored, its words stemmed in
that language, text written without spaces read as character bigrams, and the query analysed in
its own language (issue 77). Each question below found nothing, or the wrong page first, when
keyword search read every text as English and each CJK run as one phrase."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ragidx.app import Index
from ragidx.indexer.ingest.languages import detect
from ragidx.indexer.model.sources import keyword_only_note
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.storage.lexical import query_terms, terms
from tests.support.cli import ragidx
from tests.support.real_models import installed
from tests.support.search_checks import porter_bm25

# Short pages of command help in four languages and English, written for these tests.
PAGES = {
    "zh/chown.md": "chown 命令用于更改文件或目录的所有者和所属组。只有超级用户才能把文件交给其他用户。"
    "例如，chown 用户名 文件名 会把文件的所有者改为该用户。",
    "zh/chmod.md": "chmod 命令用于修改文件的访问权限。可以为所有者、组和其他用户分别设置读、写和执行权限。"
    "例如，chmod +x 脚本 会让脚本可以执行。",
    "zh/tar.md": "tar 命令用于把多个文件打包成一个归档文件，也可以解压已有的归档。"
    "配合 gzip 可以压缩归档，节省磁盘空间。",
    "de/gzip.md": "Mit gzip lassen sich Dateien komprimieren. Die komprimierten Dateien erhalten "
    "die Endung .gz und belegen weniger Speicherplatz auf der Festplatte.",
    "de/chmod.md": "Mit chmod ändert man die Zugriffsrechte einer Datei. So lässt sich ein Skript ausführbar "
    "machen, damit es gestartet werden kann.",
    "de/cp.md": "Mit cp kopiert man Dateien und Verzeichnisse an einen anderen Ort. Vorhandene Dateien "
    "werden dabei ohne Nachfrage überschrieben.",
    "ja/chown.md": "chown コマンドはファイルの所有者を変更します。"
    "所有者とグループを同時に指定することもできます。",
    "ja/chmod.md": "chmod コマンドはファイルのアクセス権限を変更します。"
    "実行権限を付けるとスクリプトを実行できるようになります。",
    "ja/df.md": "df コマンドはディスクの空き容量を表示します。ファイルシステムごとの使用量を確認できます。",
    "ko/chown.md": "chown 명령은 파일의 소유자를 변경합니다. 소유자와 그룹을 함께 바꿀 수도 있습니다.",
    "ko/chmod.md": "chmod 명령은 파일의 권한을 변경합니다. 실행 권한을 주면 스크립트를 실행할 수 있습니다.",
    "ko/df.md": "df 명령은 디스크의 남은 용량을 보여줍니다. 파일 시스템마다 사용량을 확인할 수 있습니다.",
    "en/ln.md": "ln creates links between files. A symbolic link points to another file by its path, "
    "while a hard link is another name for the same file.",
}
# Each question as a native speaker would type it, and the page that answers it.
QUESTIONS = [
    ("怎样把文件的所有者改成别的用户", "zh/chown.md"),  # a sentence: no CJK run of it is in any page
    ("Wie komprimiere ich eine Datei?", "de/gzip.md"),  # inflected: komprimiere/komprimiert, Datei/Dateien
    ("ファイルに実行権限を付けたい", "ja/chmod.md"),  # kana and kanji in one run, a particle inside
    ("소유자는 어떻게 바꾸나요", "ko/chown.md"),  # particles on every word: 소유자는, not 소유자를
    ("make a symbolic link to a file", "en/ln.md"),
]
LANGUAGES = {"zh": 3, "de": 3, "ja": 3, "ko": 3, "en": 1}


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("languages") / "pages"
    for name, text in PAGES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def index(pages, tmp_path_factory, tiny_models):
    folder = tmp_path_factory.mktemp("languages") / "index"
    with Index.build([pages], folder, model=str(tiny_models["qwen2"]), dense=False, progress=False) as built:
        yield built


def found(index: Index, query: str) -> list[str]:
    return [
        Path(hit.path).parent.name + "/" + Path(hit.path).name
        for hit in index.search(query, k=3, mode="lexical")
    ]


@pytest.mark.parametrize(("question", "page"), QUESTIONS, ids=["zh", "de", "ja", "ko", "en"])
def test_a_question_finds_its_page_first_in_its_own_language(index, question, page):
    assert found(index, question)[0] == page


def test_each_pages_language_is_told_and_stored(index):
    with sqlite3.connect(index.reader.directory / "ragidx.db") as db:
        told = dict(
            db.execute(
                "select d.path, t.language from chunks_terms t join chunks c on c.id = t.rowid "
                "join documents d on d.id = c.document_id"
            ).fetchall()
        )
    assert {Path(path).parent.name + "/" + Path(path).name: language for path, language in told.items()} == {
        name: name.split("/")[0] for name in PAGES
    }
    assert index.info()["languages"] == LANGUAGES


def test_terms_are_stems_in_the_pages_language_and_bigrams_of_cjk_runs():
    """Hand-written expectations: Snowball's German, Porter for English (as FTS5's own), pairs
    of CJK characters, a lone one kept, full-width letters folded."""
    assert terms("Dateien komprimieren", "de") == "datei komprimi"
    assert terms("Links are files", "en") == "link ar file"
    assert terms("文件的所有者 是 ＡＢＣ", "zh") == "abc 文件 件的 的所 所有 有者 是"
    assert query_terms("ファイルの中から文字列を検索する", "ja") == [
        "ファ",
        "ァイ",
        "イル",
        "文字",
        "字列",
        "検索",
    ]
    assert query_terms("Wie komprimiere ich eine Datei?", "de") == ["komprimi", "datei"]
    assert query_terms("what is it", "en") == ["what", "is", "it"]  # nothing but stop words: kept


def test_a_short_query_is_told_among_the_indexs_languages():
    assert detect("Datei herunterladen", ["de", "en"]) == "de"
    assert detect("git commit", ["de", "en"]) == "en"
    assert detect("anything", ["fr"]) == "fr"


def test_an_index_written_before_languages_is_searched_until_its_next_build_rebuilds_its_terms(
    tmp_path, tiny_models, sample_corpus
):
    """What such an index held: chunks_fts (porter, kept by triggers) and no terms table."""
    folder = tmp_path / "index"
    corpus = sample_corpus / "notes"
    model = str(tiny_models["qwen2"])
    with Index.build([corpus], folder, model=model, dense=False, progress=False) as built:
        before = [hit.chunk_id for hit in built.search("tides and the moon", k=5, mode="lexical")]
    with sqlite3.connect(folder / "ragidx.db") as db:
        db.execute("drop table chunks_terms")
        db.execute("create virtual table chunks_fts using fts5(text, content='chunks', tokenize='porter')")
        db.execute("insert into chunks_fts(chunks_fts) values('rebuild')")
        expected = porter_bm25(db, ["tides", "moon"], 5)
    with Index.open(folder) as old:
        assert [hit.chunk_id for hit in old.search("tides and the moon", k=5, mode="lexical")] == [
            chunk_id for chunk_id, _ in expected
        ]
        assert Index.check(folder).healthy
    with Index.build([corpus], folder, model=model, progress=False) as rebuilt:
        assert [hit.chunk_id for hit in rebuilt.search("tides and the moon", k=5, mode="lexical")] == before
    with sqlite3.connect(folder / "ragidx.db") as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
    assert "chunks_terms" in tables and "chunks_fts" not in tables


def test_build_and_info_name_the_languages_found(pages, tmp_path, tiny_models):
    folder = tmp_path / "index"
    built = ragidx("build", pages / "de", pages / "en", "--index", folder, "--model", tiny_models["qwen2"])
    assert "languages: de 3, en 1" in built.stdout.splitlines()
    shown = ragidx("info", "--index", folder).stdout.splitlines()
    assert any(line.split() == ["languages", '{"de":', "3,", '"en":', "1}"] for line in shown)


def test_a_model_that_reads_english_only_says_which_languages_keywords_alone_serve():
    assert keyword_only_note("minilm", {"de": 30, "en": 2, "ja": 5}) == (
        "minilm reads en only: de (30 chunks), ja (5 chunks) served by keyword search alone "
        "(docs/choosing.md#languages)"
    )
    assert keyword_only_note("minilm", {"en": 2}) == "" and keyword_only_note("gemma3-270m", {"de": 3}) == ""


@pytest.mark.real
def test_hybrid_search_leaves_out_the_vectors_of_a_model_that_cannot_read_the_query(pages, tmp_path):
    """MiniLM reads English: a Japanese question's hybrid list is its keyword list; an English
    one's still fuses both (the index's equal weights: too few chunks to tune)."""
    folder = tmp_path / "index"
    model = installed("minilm")
    with Index.build([pages], folder, model=model, dense=True, progress=False) as built:
        japanese, english = QUESTIONS[2][0], QUESTIONS[4][0]
        hybrid = built.search(japanese, k=5, explain=True)
        assert [h.chunk_id for h in hybrid] == [
            h.chunk_id for h in built.search(japanese, k=5, mode="lexical")
        ]
        assert {h.explain.weights["dense"] for h in hybrid} == {0.0}
        assert {h.explain.weights["dense"] for h in built.search(english, k=5, explain=True)} == {0.5}
        weighed = built.search(japanese, k=5, explain=True, weights=Fusion(dense=1, lexical=1))
        assert {h.explain.weights["dense"] for h in weighed} == {1.0}  # weights given: as given


def test_an_indexs_shares_weigh_the_querys_language():
    """A stray chunk told Catalan must not turn a Spanish question Catalan (stems and stop words of
    another language would miss every Spanish page); a clear English question stays English."""
    assert detect("comprimir una carpeta", ["es", "ca"]) == "ca"  # unweighted: as likely Catalan
    assert detect("comprimir una carpeta", {"es": 2890, "ca": 1}) == "es"
    assert detect("make a file executable", {"de": 70, "en": 30}) == "en"
    assert detect("eine Datei ausführbar machen", {"de": 70, "en": 30}) == "de"


@pytest.mark.real
def test_a_new_index_in_languages_its_model_cannot_read_embeds_nothing(tmp_path):
    """MiniLM and a Japanese corpus: the sample's language decides before any chunk is embedded
    (hybrid search would answer its queries by keywords alone anyway)."""
    docs = tmp_path / "ja"
    docs.mkdir()
    pages = [text for name, text in PAGES.items() if name.startswith("ja/")]
    for number in range(300):
        (docs / f"page{number}.md").write_text(f"{pages[number % 3]}\n\n{pages[(number + 1) % 3]}\n", "utf-8")
    report = Index.update(
        [docs], tmp_path / "index", model=installed("minilm"), chunk_tokens=16, progress=False
    )
    assert report.sample is not None and report.sample.unread == "minilm reads en only; the sample is ja"
    assert (report.dense, report.embedded_tokens, report.total_documents) == (False, 0, 300)
    assert "keeps no vectors" in report.sample.describe_decision() and report.languages == {
        "ja": report.total_chunks
    }


def test_a_query_on_an_index_in_one_language_loads_no_language_model():
    """Telling needs py3langid's model (0.4 s to load): a keyword query in a fresh process on an
    index in one language must not pay for it."""
    code = (
        "import sys\nfrom ragidx.indexer.storage.lexical import match_expression, query_language\n"
        "query = 'Wie komprimiere ich eine Datei?'\n"
        "print(match_expression(query, query_language(query, {'de': 3})), 'py3langid' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ['"komprimi"', "OR", '"datei"', "False"]
