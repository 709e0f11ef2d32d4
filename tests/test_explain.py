"""`explain` (issue 17, "Answers that explain themselves"): each hit says its dense and keyword ranks, its
scores and which query words it matched in its content, its title line and its front-matter keywords.

The fixture's title word ("zephyr") and keywords ("throttling", "quota") occur nowhere in its body, so a
matched word tells which field it came from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections
from research_agent.search.service import matched_words, query_knowledge

FIXTURE = Path(__file__).parent / "fixtures" / "explain" / "zephyr_manual.md"


@pytest.fixture
def kb(container, fake_embedder):
    path = Path.cwd() / "docs" / FIXTURE.name
    path.parent.mkdir()
    shutil.copy(FIXTURE, path)
    collections.create_collection(container, "ops")
    ingest.ingest_path(container, path, "ops")
    return container


def _hit(result, word: str):
    return next(h for h in result.results if word in h.content)


def test_ranks_and_scores_are_the_hits_own(kb):
    result = query_knowledge(kb, "retry budget parked", collections=["ops"], top_k=5, explain=True)
    assert result.results
    for hit in result.results:
        e, meta = hit.explain, hit.metadata
        assert (e["dense_rank"], e["keyword_rank"]) == (meta["ranks"].get("dense"), meta["ranks"].get("keyword"))
        for key in ("dense", "keyword", "fused", "rerank"):
            assert e[key] == meta["retrieval"].get(key), key
        assert e["mode"] == "hybrid" and e["fusion"] == kb.settings.fusion_method
    top = result.results[0].explain
    assert top["keyword_rank"] == 1 and top["keyword"] > 0 and top["dense_rank"] >= 1


def test_matched_words_name_the_field_they_occur_in(kb):
    result = query_knowledge(kb, "zephyr retries parked xylophone", collections=["ops"], top_k=5, explain=True)
    matched = _hit(result, "retry budget").explain["matched"]
    assert matched["content"] == ["retries", "parked"]  # stems: "retries" ~ "retry", "parked" ~ "park"
    assert matched["title"] == ["zephyr", "parked"]  # the document title, and the header path "Parking jobs"
    assert matched["keywords"] == []
    by_keywords = query_knowledge(kb, "throttling heartbeat", collections=["ops"], top_k=5, explain=True)
    matched = _hit(by_keywords, "heartbeat").explain["matched"]
    assert matched == {"content": ["heartbeat"], "title": [], "keywords": ["throttling"]}


def test_explain_gives_the_dense_weight_fusion_used(container, fake_embedder, docs_folder):
    """The adaptive weight (retrieve.adaptive_dense_weight) convex fusion gave this query: fused with that weight
    as a fixed one, the pool's fused scores come out the same (an outside tester could not see it before)."""
    from research_agent.search.retrieve import fusion_scores, retrieve_candidates

    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs")
    query = "how do I configure the server"
    result = query_knowledge(container, query, collections=["docs"], top_k=5, explain=True)
    weights = {hit.explain["dense_weight"] for hit in result.results}
    assert len(weights) == 1 and isinstance(w := weights.pop(), float) and 0.0 < w < 1.0
    pool = retrieve_candidates(container, query, ["docs"], mode="hybrid", n=50)
    assert len(pool) >= 5
    fixed = fusion_scores([x.dense for x in pool], [x.keyword for x in pool], w, adaptive=False)
    assert fixed == pytest.approx([x.fused for x in pool], abs=1e-3)
    prior = fusion_scores([x.dense for x in pool], [x.keyword for x in pool], 0.5, adaptive=False)
    assert prior != pytest.approx([x.fused for x in pool], abs=1e-3)  # the weight is the query's, not the prior
    semantic = query_knowledge(container, query, collections=["docs"], mode="semantic", explain=True)
    assert all(hit.explain["dense_weight"] is None for hit in semantic.results)


def test_rrf_explains_its_fixed_weight(container, fake_embedder, monkeypatch):
    from research_agent.container import build_container

    monkeypatch.setenv("RESEARCH_AGENT_FUSION_METHOD", "rrf")
    monkeypatch.setenv("RESEARCH_AGENT_HYBRID_DENSE_WEIGHT", "0.3")
    path = Path.cwd() / FIXTURE.name
    shutil.copy(FIXTURE, path)
    collections.create_collection(container, "ops")
    ingest.ingest_path(container, path, "ops")
    c = build_container()
    try:
        result = query_knowledge(c, "retry budget", collections=["ops"], top_k=3, explain=True)
    finally:
        c.close()
    assert result.results and all(h.explain["dense_weight"] == 0.3 and h.explain["fusion"] == "rrf"
                                  for h in result.results)


def test_a_word_absent_from_the_hit_is_not_listed():
    assert matched_words("xylophone retries", "A job is parked after its retry budget") == ["retries"]
    assert matched_words("the of", "the of") == []  # stop words are not keyword words
    assert matched_words("retry", "") == []


def test_no_explain_without_the_flag(kb):
    result = query_knowledge(kb, "retry budget parked", collections=["ops"], top_k=5)
    assert result.results and all(hit.explain is None for hit in result.results)
    assert all(hit["explain"] is None for hit in result.model_dump(mode="json")["results"])


@pytest.mark.slow
def test_cli_explain_prints_a_line_per_hit_and_json_carries_it(tmp_path):
    """A real `research-agent query --explain` process with the packaged model."""
    work = tmp_path / "work"
    shutil.copy(FIXTURE, work / FIXTURE.name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RESEARCH_AGENT_STORE": str(tmp_path / "store")}

    def run(*args: str) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "research_agent", *args], capture_output=True, text=True,
                             timeout=300, cwd=work, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return out

    run("collections", "create", "ops")
    run("kb", "add-folder", ".", "--collection", "ops")
    query = ("query", "zephyr retry budget", "--collections", "ops", "--no-rerank", "--top-k", "2")
    hits = json.loads(run("--json", *query, "--explain").stdout)["results"]
    assert hits and all(h["explain"]["dense_rank"] == h["metadata"]["ranks"].get("dense") for h in hits)
    parked = next(h for h in hits if "retry budget" in h["content"])
    assert parked["explain"]["matched"]["title"] == ["zephyr"]
    assert parked["explain"]["matched"]["content"] == ["retry", "budget"]
    text = run(*query, "--explain").stdout
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("dense ")]
    assert len(lines) == len(hits) and "matched content: retry, budget; title: zephyr" in text, text
    assert "rerank –" in lines[0] and "(dense weight 0." in lines[0]
    assert "dense #" not in run(*query).stdout  # no explain lines without the flag
