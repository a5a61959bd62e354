"""Snippet choice and highlighting, against hand-worked examples."""

from __future__ import annotations

from ragidx.indexer.search.snippets import SNIPPET_CHARS, Snippet, make_snippet, query_stems
from tests.support.documents import spans_of


def test_query_stems_drop_stop_words_unless_nothing_else_is_left():
    assert query_stems("How do I reset my passwords?") == {"reset", "password"}
    assert query_stems("how do I") == {"how", "do", "i"}


def test_the_sentence_with_most_query_words_wins_and_its_words_are_marked():
    sentences = ["The sky is blue.", "Resetting a password sends a link.", "Links expire."]
    text = "  ".join(sentences)
    snippet = make_snippet(text, spans_of(text, sentences), query_stems("password reset link"))
    assert snippet.text == "Resetting a password sends a link. Links expire."  # next sentence fits
    assert [snippet.text[s:e] for s, e in snippet.highlights] == ["Resetting", "password", "link", "Links"]
    assert snippet.render(lambda w: f"[{w}]") == "[Resetting] a [password] sends a [link]. [Links] expire."


def test_ties_go_to_the_earliest_sentence_and_no_match_shows_the_start():
    sentences = ["Alpha beta.", "Gamma delta.", "Alpha again."]
    text = " ".join(sentences)
    assert make_snippet(text, spans_of(text, sentences), query_stems("alpha")).text.startswith("Alpha beta.")
    assert make_snippet(text, spans_of(text, sentences), query_stems("zeta")).highlights == []


def test_a_long_sentence_is_cut_to_a_window_around_the_first_match():
    words = [f"w{i}" for i in range(200)]
    words[100] = "needle"
    text = " ".join(words) + "."
    snippet = make_snippet(text, [(0, len(text))], query_stems("needle"))
    assert snippet.text.startswith("…") and snippet.text.endswith("…")
    assert len(snippet.text) <= SNIPPET_CHARS + 2
    assert [snippet.text[s:e] for s, e in snippet.highlights] == ["needle"]


def test_render_without_highlights_is_the_plain_text():
    assert Snippet("plain text").render(str.upper) == "plain text"


def test_cjk_pairs_and_words_stemmed_in_the_querys_language_are_marked():
    """What keyword search matched: pairs of CJK characters (a stretch of them one mark), German
    words by their German stems."""
    sentences = ["tar 命令用于打包文件。", "chown 命令用于更改文件的所有者。"]
    text = "".join(sentences)
    snippet = make_snippet(text, spans_of(text, sentences), query_stems("怎么更改文件", "zh"), "zh")
    assert snippet.text == "chown 命令用于更改文件的所有者。"
    assert [snippet.text[s:e] for s, e in snippet.highlights] == ["更改文件"]  # 更改 改文 文件: one mark
    german = ["Mit cp kopiert man Dateien.", "Mit gzip lassen sich Dateien komprimieren."]
    text = " ".join(german)
    snippet = make_snippet(text, spans_of(text, german), query_stems("Datei komprimieren", "de"), "de")
    assert snippet.text == german[1]
    assert [snippet.text[s:e] for s, e in snippet.highlights] == ["Dateien", "komprimieren"]
