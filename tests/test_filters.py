"""Filters inside the search (path globs, extensions, metadata), --min-score, and Index.build."""

from __future__ import annotations

import fnmatch
import json
import sqlite3

import pytest

from ragidx.app import Index
from ragidx.app.catalog import parse_meta
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.storage.filters import Filters


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, sample_corpus):
    folder = tmp_path_factory.mktemp("filters") / "index"
    with Index.build(
        [sample_corpus],
        folder,
        model=str(tiny_models["qwen2"]),
        device="cpu",
        chunk_tokens=48,
        progress=False,
        tune=False,  # equal weights: tuning would find a random model's vectors worth nothing
    ) as opened:
        yield opened


def chunk_table(index: Index) -> list[dict]:
    """Every chunk with its document's path and metadata, read with plain sqlite3."""
    with sqlite3.connect(index.reader.directory / "ragidx.db") as db:
        rows = db.execute(
            "select c.id, d.path, d.metadata from chunks c join documents d on d.id = c.document_id "
            "order by c.id"
        ).fetchall()
    return [{"id": i, "path": p, "metadata": json.loads(m)} for i, p, m in rows]


def expected_ids(index: Index, keep) -> list[int]:
    return [row["id"] for row in chunk_table(index) if keep(row)]


def full_ranking(index: Index, query: str, mode: str) -> list[int]:
    """The unfiltered ranking of every chunk (dense) or every matching chunk (lexical)."""
    return [h.chunk_id for h in index.search(query, k=1000, mode=mode)]


def has_meta(row: dict, key: str, value: str) -> bool:
    found = row["metadata"].get(key)
    return value in found if isinstance(found, list) else found == value


@pytest.mark.parametrize(
    ("filters", "keep"),
    [
        (Filters.create(paths=["faq/*"]), lambda r: "/faq/" in r["path"]),
        (
            Filters.create(paths=["*.html", "notes/t*"]),
            lambda r: fnmatch.fnmatch(r["path"], "*.html") or "/notes/t" in r["path"],
        ),
        (Filters.create(exts=[".MD", "txt"]), lambda r: r["path"].endswith((".md", ".txt"))),
        (Filters.create(meta={"category": "account"}), lambda r: r["metadata"].get("category") == "account"),
        (
            Filters.create(meta={"tags": ["refunds", "privacy"]}),
            lambda r: has_meta(r, "tags", "refunds") or has_meta(r, "tags", "privacy"),
        ),
        (Filters.create(exts=["md"], meta={"category": "account"}), lambda r: False),
        (
            Filters.create(meta={"updated": "2026-03-02"}),
            lambda r: r["metadata"].get("updated") == "2026-03-02",
        ),
    ],
)
def test_filters_select_the_same_chunks_as_an_independent_computation(index, filters, keep):
    assert index.reader.filtered_chunk_ids(filters).tolist() == expected_ids(index, keep)


def test_metadata_comes_from_front_matter_and_html_meta(index):
    account = {
        row["path"].rsplit("/", 1)[1] for row in chunk_table(index) if has_meta(row, "category", "account")
    }
    assert account == {"password-reset.html", "delete-account.markdown"}


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_a_filtered_search_is_the_unfiltered_ranking_restricted(index, mode):
    query = "how do I return my bicycle and get a refund, or bake sourdough at high tide"
    allowed = set(expected_ids(index, lambda r: "/notes/" in r["path"]))
    hits = index.search(query, k=3, mode=mode, filters={"path": "notes/*"})
    assert len(hits) == 3 and all("/notes/" in h.path for h in hits)
    restricted = {m: [i for i in full_ranking(index, query, m) if i in allowed] for m in ("dense", "lexical")}
    if mode == "hybrid":  # fewer than 100 chunks: the restricted rankings are the whole candidate lists
        lists = {name: [(i, 0.0) for i in ranking] for name, ranking in restricted.items()}
        fused = Fusion.of_index(index.meta).fuse(lists)
        assert [h.chunk_id for h in hits] == [i for i, _ in fused[:3]]
    else:
        assert [h.chunk_id for h in hits] == restricted[mode][:3]


def test_matches_far_down_the_dense_ranking_still_fill_k(index):
    query = "keeping ships off the rocks at night"
    ranking = full_ranking(index, query, "dense")
    rows = index.reader.chunk_rows(ranking)
    best_rank: dict[str, int] = {}
    for rank, chunk_id in enumerate(ranking):
        best_rank.setdefault(rows[chunk_id]["path"], rank)
    path = max(best_rank, key=best_rank.get)  # the document whose best chunk ranks lowest
    own = [i for i in ranking if rows[i]["path"] == path]
    k = min(3, len(own))
    assert best_rank[path] >= 10 * k  # far beyond what an unfiltered top-k search fetches
    hits = index.search(query, k=k, mode="dense", filters={"path": path})
    assert [h.chunk_id for h in hits] == own[:k]


def test_a_filter_with_fewer_matches_than_k_returns_them_all(index):
    matching = expected_ids(index, lambda r: r["path"].endswith("password-reset.html"))
    for mode in ("dense", "hybrid"):
        hits = index.search(
            "password", k=len(matching) + 5, mode=mode, filters={"path": "*/password-reset.html"}
        )
        assert sorted(h.chunk_id for h in hits) == matching
    assert index.search("password", k=5, filters={"meta": {"category": "nothing-has-this"}}) == []


def test_min_score_cuts_the_ranking_at_the_threshold(index):
    hits = index.search("sourdough starter", k=8, mode="dense")
    threshold = (hits[2].score + hits[3].score) / 2
    kept = index.search("sourdough starter", k=8, mode="dense", min_score=threshold)
    assert [h.chunk_id for h in kept] == [h.chunk_id for h in hits[:3]]


def test_snippets_show_the_best_matching_sentence_with_the_query_words_marked(index):
    hit = index.search("forgot password reset link", k=1, mode="lexical")[0]
    marked = [hit.snippet.text[s:e].lower() for s, e in hit.snippet.highlights]
    assert marked and set(marked) <= {
        "forgot",
        "password",
        "passwords",
        "reset",
        "resetting",
        "link",
        "links",
    }
    assert " ".join(hit.snippet.text.replace("…", "").split()) in " ".join(hit.text.split())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"colour": "red"}, "unknown filter 'colour'"),
        ({"path": 3}, "string or a list of strings"),
        ({"meta": {"bad key": "x"}}, "metadata key"),
        ({"meta": {"k": {"nested": 1}}}, "compares strings"),
        ({"ext": "*"}, "--ext expects"),
        ({"meta": ["k=v"]}, "must map keys"),
    ],
)
def test_bad_filters_are_refused_with_a_message(index, spec, message):
    with pytest.raises(RagidxError, match=message):
        index.search("x", filters=spec)


def test_meta_options_parse_key_value_pairs():
    assert parse_meta(["tag=a", "tag=b", "lang=en=GB"]) == {"tag": ["a", "b"], "lang": ["en=GB"]}
    with pytest.raises(RagidxError, match="KEY=VALUE"):
        parse_meta(["novalue"])


def test_unknown_build_options_are_refused(tmp_path, sample_corpus):
    with pytest.raises(RagidxError, match="unknown build option 'chunk_size'"):
        Index.build([sample_corpus], tmp_path / "index", chunk_size=10)


def test_build_options_are_keywords_or_one_typed_object(tmp_path, sample_corpus):
    """The CLI hands the pipeline one BuildOptions; the Python API takes keywords too, flat strategy
    options included, but not both at once (which would win would be a guess)."""
    from ragidx.app import BuildOptions

    typed = BuildOptions.of(tmp_path / "index", strategy="htp", layers="1-2", chunk_tokens=64)
    expected = (tmp_path / "index", {"layers": "1-2"}, 64)
    assert (typed.index_dir, typed.strategy_options, typed.chunk_tokens) == expected
    both = r"^give a build's options as keywords or as one BuildOptions, not both$"
    with pytest.raises(RagidxError, match=both):
        Index.update([sample_corpus], options=typed, chunk_tokens=32)
    with pytest.raises(RagidxError, match="--ray-workers needs --ray"):
        BuildOptions.of(ray_workers=2)
    assert not (tmp_path / "index").exists()
