"""The diversity pass (issue 17: "an optional diversity pass (MMR) so the top k are not five chunks of one
section"): MMR within sections (research_agent/search/diversity.py), off unless asked.

The manual below has one section ("Retry budget") of six near-duplicate chunks that all match the query better
than the other three sections do, so without diversity they fill the top of the list.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from research_agent.catalog import collections
from research_agent.ingest import ingest_path
from research_agent.search import diversity
from research_agent.search.diversity import mmr_order, redundancies
from research_agent.search.service import query_knowledge

QUERY = "retry budget"
BUDGET = "Job runner manual > Retry budget"


def manual() -> str:
    base = ("A job that fails is retried until its retry budget is spent. The retry budget counts the attempts a "
            "job may make within one hour; each retry waits for the backoff delay and draws one unit from the "
            "budget. When the retry budget reaches zero the job stops retrying and is parked for an operator. ")
    endings = ["The budget is set per queue.", "The budget is reset every hour.", "The budget is logged per job.",
               "The budget is shown on the dashboard.", "The budget is the same for every worker.",
               "The budget cannot be negative."]
    # three repeats of `base` per paragraph: each paragraph is its own chunk (the model reads 256 tokens)
    budget = "\n\n".join(base * 3 + ending for ending in endings)
    return f"""# Job runner manual

## Retry budget

{budget}

## Backoff delays

Between two attempts the runner waits an exponential backoff delay: one second, then two, four and eight,
capped at one minute, with random jitter so that retries of many jobs do not arrive together.

## Parking failed jobs

A parked job keeps its payload and last error. Operators requeue it from the console after fixing the cause;
requeueing restores a fresh retry budget.

## Alerting on retries

An alert fires when more than five percent of jobs in a queue retry within ten minutes, or when any job is
parked. Alerts name the queue and the most common error.
"""


def guide() -> str:
    """One section ("Calibrated scores") of three different-but-related chunks, one of them twice (a near-copy:
    cosine 0.996 with the packaged model; the two different ones have cosine 0.72, the median of two chunks of
    one section of our docs being 0.53), and three sections about something else (scores under 0.03)."""
    calib = ("A hit's relevance score is a calibrated probability: the raw fused score of the query and chunk is "
             "mapped through a logistic curve fitted on judged queries, so a score of 0.7 means that about seven "
             "in ten hits scored like this one were judged relevant. The calibration curve is fitted per mode and "
             "stored with the collection, and a recalibration runs after every large ingest. ")
    labels = ("Labels turn calibrated scores into words for the reader: a hit at or above 0.5 is labelled "
              "Relevant, one from 0.2 to 0.5 Possibly relevant, and anything lower Not relevant. The label "
              "thresholds were chosen on judged queries so that Relevant hits are right nine times in ten, and "
              "the command line colours each label. Agents read the label before the probability. ")
    return f"""# Scoring guide

## Calibrated scores

{calib * 3}The curve has two parameters.

{calib * 3}The curve is refitted monthly.

{labels * 3}

## Disk layout

The store keeps one folder per collection with the vector index, the keyword index and a manifest per document;
backups copy the folder while no writer holds the lock.

## Network ports

The server listens on port 8000 by default and refuses requests whose origin header names another host.

## Release notes

Version two added folder watching, the records importer and a faster start of the command line.
"""


# -- the selection itself ------------------------------------------------------------------------------
def test_near_duplicates_of_a_picked_chunk_go_below_every_fresh_section():
    vec = [1.0, 0.0]
    order = mmr_order([0.9, 0.85, 0.8, 0.3], redundancies([vec, vec, vec, [0.0, 1.0]], ["a", "a", "a", "b"]), 3)
    assert order == [0, 3, 1]  # the weak other section beats two near-duplicates of the first pick


def test_lambda_one_keeps_the_given_order_and_other_sections_are_never_redundant():
    vecs = [[1.0, 0.0]] * 4  # identical vectors, but four sections: nothing is redundant
    red = redundancies(vecs, ["a", "b", "c", "d"])
    assert not red[~np.eye(4, dtype=bool)].any()
    assert mmr_order([0.9, 0.8, 0.7, 0.6], red, 4) == [0, 1, 2, 3]
    same = redundancies(vecs, ["a"] * 4)
    assert mmr_order([0.9, 0.8, 0.7, 0.6], same, 4, lam=1.0) == [0, 1, 2, 3]


def test_a_same_section_chunk_that_says_something_else_keeps_its_place():
    """Redundancy is the cosine, not "same section = duplicate": an orthogonal chunk of the picked one's section
    still beats a weaker hit elsewhere; a missing vector counts as a duplicate."""
    red = redundancies([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], ["a", "a", "b"])
    assert mmr_order([0.9, 0.8, 0.4], red, 3) == [0, 1, 2]
    assert redundancies([[1.0, 0.0], None], ["a", "a"])[0, 1] == 1.0
    assert mmr_order([], red, 3) == [] and mmr_order([0.5], np.zeros((1, 1)), 0) == []


def test_only_near_copies_are_redundant_and_take_a_documents_slots_last():
    """Cosine 0.72 (two different chunks of one section) is no redundancy; 0.95 is half; a copy is 1. The cap
    then keeps the different chunk and leaves the copy out; without vectors every same-section chunk is a copy."""
    from research_agent.search.diversity import cap_sections_first
    from research_agent.search.retrieve import Candidate

    a, b, copy = [1.0, 0.0], [0.72, (1 - 0.72 ** 2) ** 0.5], [0.95, (1 - 0.95 ** 2) ** 0.5]
    red = redundancies([a, b, copy, a], ["s", "s", "s", "t"])
    assert red[0, 1] == 0 and red[0, 2] == pytest.approx(0.5, abs=1e-3) and red[0, 3] == 0
    assert mmr_order([0.9, 0.3, 0.7, 0.01], red, 4) == [0, 1, 2, 3]  # only the 0.95 copy pays: 0.35 - 0.25 < 0.15
    assert mmr_order([0.3, 0.25, 0.2, 0.01], red, 3) == [0, 1, 3]  # the copy (0.2 - 0.5) goes below 0.01
    cands = [Candidate(f"c{i}", "", {"collection": "k", "source_document": "d", "header_path": sec})
             for i, sec in enumerate(["s", "s", "s", "t"])]
    assert [x.id for x in cap_sections_first(cands, 2, [a, copy, b, a])] == ["c0", "c2"]
    assert [x.id for x in cap_sections_first(cands, 2)] == ["c0", "c3"]


# -- a real store with the packaged model --------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from conftest import isolated_container

    root = tmp_path_factory.mktemp("diversity")
    with isolated_container(root) as c:
        path = root / "manual.md"
        path.write_text(manual())
        collections.create_collection(c, "ops")
        ingest_path(c, str(path), "ops")
        (root / "guide.md").write_text(guide())
        collections.create_collection(c, "guide")
        ingest_path(c, str(root / "guide.md"), "guide")
        yield c
        c.close()


def _sections(result) -> list[str]:
    return [h.header_path for h in result.results]


@pytest.mark.slow
def test_off_unless_asked_the_ranking_is_untouched(store, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the diversity pass ran without being asked")

    monkeypatch.setattr(diversity, "diversify", refuse)
    default = query_knowledge(store, QUERY, collections=["ops"], top_k=4, rerank=False, per_document_cap=0)
    off = query_knowledge(store, QUERY, collections=["ops"], top_k=4, rerank=False, per_document_cap=0, diverse=False)
    assert [(h.metadata["chunk_id"], h.relevance_score) for h in default.results] == \
           [(h.metadata["chunk_id"], h.relevance_score) for h in off.results]
    assert "diversity" not in default.timings_ms
    scores = [h.relevance_score for h in default.results]
    assert scores == sorted(scores, reverse=True)
    assert _sections(default).count(BUDGET) >= 3, _sections(default)  # the problem the pass exists for


@pytest.mark.slow
@pytest.mark.parametrize("cap", [None, 0])  # the default per-document cap (3), and none
def test_diverse_spreads_one_sections_near_duplicates_over_sections(store, cap):
    plain = query_knowledge(store, QUERY, collections=["ops"], top_k=3, rerank=False, per_document_cap=cap)
    assert _sections(plain) == [BUDGET] * 3
    spread = query_knowledge(store, QUERY, collections=["ops"], top_k=3, rerank=False, per_document_cap=cap,
                             diverse=True)
    sections = _sections(spread)
    assert len(set(sections)) == 3 and sections[0] == BUDGET, sections
    assert spread.results[0].metadata["chunk_id"] == plain.results[0].metadata["chunk_id"]  # the best stays first
    assert spread.timings_ms["diversity"] >= 0
    by_id = {h.metadata["chunk_id"]: h.relevance_score for h in plain.results}
    for hit in spread.results:  # each hit keeps its own score
        assert by_id.get(hit.metadata["chunk_id"], hit.relevance_score) == hit.relevance_score


@pytest.mark.slow
@pytest.mark.parametrize("cap", [None, 0])
def test_diverse_keeps_a_relevant_same_section_chunk_that_is_not_a_copy(store, cap):
    """Only near-copies move down: the section's second, different chunk (0.585, "Relevant") stays second, above
    the other sections' hits (< 0.03); its near-copy (0.545) goes below them, and the rest descends."""
    query = "how are scores calibrated into probabilities"
    plain = query_knowledge(store, query, collections=["guide"], top_k=4, rerank=False, per_document_cap=0)
    first, other, copy = (h.metadata["chunk_id"] for h in plain.results[:3])
    assert {h.header_path for h in plain.results[:3]} == {"Scoring guide > Calibrated scores"}
    spread = query_knowledge(store, query, collections=["guide"], top_k=4, rerank=False, per_document_cap=cap,
                             diverse=True)
    ids = [h.metadata["chunk_id"] for h in spread.results]
    assert ids[:2] == [first, other], _sections(spread)
    assert copy not in ids  # below the other sections' hits (with cap 3 the document has 3 slots: no room)
    if cap == 0:
        assert "Scoring guide > Release notes" in _sections(spread)
    scores = [h.relevance_score for h in spread.results]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.slow
def test_diverse_keeps_top_k_when_sections_run_out(store):
    """Four sections, top_k 6: after one hit of each, near-duplicates fill the rest."""
    result = query_knowledge(store, QUERY, collections=["ops"], top_k=6, rerank=False, per_document_cap=0,
                             diverse=True)
    sections = _sections(result)
    assert len(sections) == 6 and len(set(sections[:4])) == 4 and sections[4:] == [BUDGET, BUDGET]


@pytest.mark.slow
def test_diverse_picks_from_the_reranked_pool(store, tiny_cross_encoder, monkeypatch):
    """With a reranker the pool is the reranked candidates (blended scores); near-duplicates still go below
    every fresh section whatever the (here meaningless) reranker scores are."""
    monkeypatch.setattr(store.settings, "reranker_model", str(tiny_cross_encoder))
    result = query_knowledge(store, QUERY, collections=["ops"], top_k=4, per_document_cap=0, diverse=True)
    assert result.reranked and not result.warnings
    assert len(set(_sections(result))) == 4, _sections(result)


# -- the MCP argument ----------------------------------------------------------------------------------
@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_query_takes_diverse(fake_embedder, no_warmup):
    from fastmcp import Client

    import mcp_server

    path = Path.cwd() / "manual.md"
    path.write_text(manual())
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "ops"})
        await client.call_tool("ingest_documents", {"path": str(path), "collection": "ops"})
        args = {"query": QUERY, "collections": "ops", "top_k": 3, "rerank": False}
        plain = (await client.call_tool("query_knowledge_base", args)).structured_content["results"]
        spread = (await client.call_tool("query_knowledge_base", {**args, "diverse": True})).structured_content
    assert [h["header_path"] for h in plain] == [BUDGET] * 3
    assert len({h["header_path"] for h in spread["results"]}) == 3


def test_the_cap_gives_a_documents_slots_to_distinct_sections_first():
    from research_agent.search.diversity import cap_sections_first
    from research_agent.search.retrieve import Candidate, cap_per_document

    def cand(i: int, doc: str, section: str) -> Candidate:
        return Candidate(f"c{i}", "", {"collection": "k", "source_document": doc, "header_path": section})

    cands = [cand(0, "a", "x"), cand(1, "a", "x"), cand(2, "b", "z"), cand(3, "a", "x"), cand(4, "a", "y"),
             cand(5, "a", "w")]
    assert [x.id for x in cap_sections_first(cands, 2)] == ["c0", "c2", "c4"]  # fused order kept
    assert [x.id for x in cap_sections_first(cands, 3)] == ["c0", "c2", "c4", "c5"]
    assert [x.id for x in cap_sections_first(cands[:4], 3)] == ["c0", "c1", "c2", "c3"]  # one section: as before
    assert cap_sections_first(cands, 1) == cap_per_document(cands, 1)
    assert cap_sections_first(cands, 0) == cands


@pytest.mark.slow
def test_cli_diverse_flag_spreads_the_hits(tmp_path):
    """A real `research-agent query --diverse` process with the packaged model: the flag reaches the library."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "manual.md").write_text(manual())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RESEARCH_AGENT_STORE": str(tmp_path / "store")}

    def run(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "research_agent", *args], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout) if args[0] == "--json" else {}

    run("collections", "create", "ops")
    run("kb", "add-document", "manual.md", "--collection", "ops")
    query = ("--json", "query", QUERY, "--collections", "ops", "--no-rerank", "--top-k", "3")
    plain = [h["metadata"]["header_path"] for h in run(*query)["results"]]
    spread = run(*query, "--diverse")
    assert plain == [BUDGET] * 3
    assert len({h["metadata"]["header_path"] for h in spread["results"]}) == 3 and "diversity" in spread["timings_ms"]
