"""The keyword index: BM25 field weights, stemming, stop words, typo tolerance, and consistency with Chroma."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections, notes as augment
from research_agent.search import service as query
from research_agent.search.keyword_index import Chunk, KeywordIndex, edits1

FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"


def chunk(cid, text, title="", keywords=None):
    meta = {"document_title": title, "header_path": "", "source_document": cid}
    if keywords:
        meta["keywords"] = keywords
    return Chunk(cid, text, meta)


def ranked(index, q, k=10):
    return [ch.id for ch, _ in index.search(q, k)]


def test_field_weights_rank_keywords_over_title_over_content():
    chunks = [
        chunk("content", f"zebra {FILLER}", title="Animals"),
        chunk("title", FILLER, title="Zebra facts"),
        chunk("keywords", FILLER, title="Animals", keywords=["zebra"]),
        chunk("none", FILLER, title="Plants"),
    ]
    index = KeywordIndex(chunks)
    assert ranked(index, "zebra") == ["keywords", "title", "content"]
    # The weights are the knob: with title and keywords weighted 0 only the content match is found.
    content_only = KeywordIndex(chunks, weights=(0, 0))
    assert ranked(content_only, "zebra") == ["content"]
    # Keywords weighted 3 count three times: a chunk with the word in its keywords beats one with it
    # twice in a content of the same length.
    twice = KeywordIndex(
        [
            chunk("content2", f"zebra zebra {FILLER}"),
            chunk("kw", f"{FILLER} lorem", keywords=["zebra"]),
            chunk("none", FILLER),
        ]
    )
    assert ranked(twice, "zebra") == ["kw", "content2"]


def test_stemming_and_stop_words():
    index = KeywordIndex([chunk("a", "The runner was running through configured servers"),
                          chunk("b", "An unrelated sentence about cooking pasta")])
    assert ranked(index, "runs configure server") == ["a"]
    assert index.query_terms("the of and is") == []
    assert index.search("the of and is", 5) == []


def test_one_letter_typos_are_tolerated():
    index = KeywordIndex([chunk("r", "Dense retrieval with cross-encoder reranking"),
                          chunk("e", "Embedding models map text to vectors"),
                          chunk("x", "Completely different subject matter here")])
    for typo in (
        "retreival",
        "retrieal",
        "retrievval",
        "retrievel",
    ):  # transposition, deletion, insertion, substitution
        assert ranked(index, typo) == ["r"], typo
    assert ranked(index, "embeddng vectros") == ["e"]
    assert index.query_terms("rtrvl") == []           # two or more edits: no guess
    assert index.corrections("tex") == []             # short words are not corrected
    assert index.query_terms("retrieval") == index.query_terms("retreival")


def test_edits1_covers_the_four_edit_kinds():
    e = edits1("abc")
    assert {"ab", "bac", "abd", "abcd", "xabc"} <= e and "abc" not in e
    assert "cba" not in e


def test_filters_apply_inside_the_keyword_ranking():
    index = KeywordIndex([chunk("a", "zebra zebra zebra"), chunk("b", "zebra")])
    hits = index.search("zebra", 1, where=lambda m: m["source_document"] == "b")
    assert [ch.id for ch, _ in hits] == ["b"]   # the filter applies before the top-k cut


def test_index_follows_update_and_remove(container, fake_embedder):
    collections.create_collection(container, "docs")
    doc = Path("notes.md")
    doc.write_text("# Notes\n\nThe zebras graze on the savanna.\n")
    ingest.ingest_path(container, doc, "docs")

    def kw(q: str) -> list[str]:
        return [h.content for h in query.query_knowledge(container, q, mode="keyword", rerank=False).results]

    assert any("zebras" in t for t in kw("zebra"))
    doc.write_text("# Notes\n\nThe giraffes browse acacia trees.\n")
    ingest.ingest_path(container, doc, "docs")
    assert kw("zebra") == [] or not any("zebras" in t for t in kw("zebra"))
    assert any("giraffes" in t for t in kw("giraffe"))
    ingest.remove_document(container, "docs", "notes.md")
    assert kw("giraffe") == []


def test_index_sees_a_write_by_another_container(container, fake_embedder):
    from research_agent.container import build_container

    collections.create_collection(container, "docs")
    augment.add_research(container, "docs", "Okapis live in the Ituri rainforest.", "src-1", title="Okapi")
    assert query.query_knowledge(container, "okapi", mode="keyword", rerank=False).results
    other = build_container()
    augment.add_research(other, "docs", "Pangolins are covered in scales.", "src-2", title="Pangolin")
    other.close()
    hits = query.query_knowledge(container, "pangolin scales", mode="keyword", rerank=False).results
    assert hits and "Pangolins" in hits[0].content


def test_index_sees_a_write_by_another_process(container, fake_embedder, tmp_path):
    collections.create_collection(container, "docs")
    augment.add_research(container, "docs", "Okapis live in the Ituri rainforest.", "src-1", title="Okapi")
    assert not query.query_knowledge(container, "narwhal", mode="keyword", rerank=False).results
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from conftest import FakeEmbedder, FAKE_EMBEDDER\n"
        "from research_agent import embeddings\n"
        "from research_agent.catalog import notes as augment\n"
        "embeddings._cache[('sentence-transformers', FAKE_EMBEDDER, 'cpu')] = FakeEmbedder()\n"
        "from research_agent.container import build_container\n"
        "augment.add_research(build_container(), 'docs', 'Narwhals have one long tusk.', 'src-3', title='Narwhal')\n"
    )
    env = dict(os.environ, RESEARCH_AGENT_EMBEDDING_MODEL="test-fake-embedder")
    subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], check=True, env=env, timeout=120,
                   cwd=Path(__file__).parents[1])
    hits = query.query_knowledge(container, "narwhal tusk", mode="keyword", rerank=False).results
    assert hits and "Narwhals" in hits[0].content


def test_keyword_search_in_server_mode(chroma_server, fake_embedder):
    from research_agent.container import build_container

    a = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    b = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    collections.create_collection(a, "kw-remote")
    try:
        augment.add_research(a, "kw-remote", "Axolotls regenerate their limbs.", "s1", title="Axolotl")
        assert "Axolotls" in query.query_knowledge(b, "axolotl", mode="keyword", rerank=False).results[0].content
        augment.add_research(a, "kw-remote", "Tardigrades survive in space.", "s2", title="Tardigrade")
        hits = query.query_knowledge(b, "tardigrade spcae", mode="keyword", rerank=False).results  # typo too
        assert hits and "Tardigrades" in hits[0].content
    finally:
        collections.delete_collection(a, "kw-remote")


def test_typo_tolerance_with_the_real_model(container, docs_folder):
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    res = query.query_knowledge(
        container, "configre the service on lnux", collections=["docs"], mode="keyword", rerank=False
    )
    assert res.results and res.results[0].source_document == "docs/guide_install.md"


@pytest.mark.parametrize("word", ["retrieval"])
def test_query_terms_are_deduplicated(word):
    index = KeywordIndex([chunk("a", word)])
    assert index.query_terms(f"{word} {word} retreival") == index.query_terms(word)
