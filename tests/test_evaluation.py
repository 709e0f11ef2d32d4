"""Evaluation: metrics by hand on a tiny BEIR set, file parsing, BEIR corpus ingest, unavailable reranking."""

from __future__ import annotations

import json
import math

import pytest

from research_agent.catalog import collections
from research_agent.errors import DocumentError, QueryError
from research_agent.search import evaluation

CORPUS = [
    {"_id": "d1", "title": "Fruit one", "text": "apple banana"},
    {"_id": "d2", "title": "Fruit two", "text": "cherry date"},
    {"_id": "d3", "title": "Fruit three", "text": "apple apple cherry"},
]
QUERIES = [{"_id": "q1", "text": "banana"}, {"_id": "q2", "text": "date"}, {"_id": "q4", "text": "apple"},
           {"_id": "q5", "text": "unjudged query"}]
# q9 is judged but has no text (skipped); q6 has only a zero judgment (not a judged query).
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td3\t1\nq2\td3\t1\nq4\td1\t1\nq9\td1\t1\nq6\td2\t0\n"


@pytest.fixture
def beir(tmp_path):
    folder = tmp_path / "beir"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CORPUS))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (folder / "qrels.tsv").write_text(QRELS)
    return folder


def test_metrics_by_hand():
    judged = {"a": 1, "b": 1}
    assert evaluation.ndcg_at_k(["a", "x", "b"], judged, 10) == pytest.approx((1 + 1 / 2) / (1 + 1 / math.log2(3)))
    assert evaluation.ndcg_at_k(["x", "a"], {"a": 1}, 10) == pytest.approx(1 / math.log2(3))
    assert evaluation.ndcg_at_k(["x", "a"], {"a": 1}, 1) == 0.0
    # Graded gains are linear (trec_eval): ideal order puts the grade-2 document first.
    assert evaluation.ndcg_at_k(["b", "a"], {"a": 2, "b": 1}, 10) == pytest.approx(
        (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert evaluation.recall_at_k(["a", "x"], judged, 10) == 0.5
    assert evaluation.recall_at_k(["x", "a", "b"], judged, 2) == 0.5
    assert evaluation.mrr_at_k(["x", "y", "b"], judged, 10) == pytest.approx(1 / 3)
    assert evaluation.mrr_at_k(["x", "y", "b"], judged, 2) == 0.0


def test_read_files(beir, tmp_path):
    assert evaluation.read_queries(beir / "queries.jsonl")["q4"] == "apple"
    qrels = evaluation.read_qrels(beir / "qrels.tsv")
    assert qrels["q1"] == {"d1": 1, "d3": 1} and "query-id" not in qrels
    bad = tmp_path / "bad.tsv"
    bad.write_text("query-id\tcorpus-id\tscore\nq1\td1\n")
    with pytest.raises(DocumentError, match="three"):
        evaluation.read_qrels(bad)
    with pytest.raises(DocumentError, match="not found"):
        evaluation.read_queries(tmp_path / "missing.jsonl")


def test_evaluate_tiny_beir_set_matches_hand_computed_numbers(container, fake_embedder, beir):
    collections.create_collection(container, "fruit")
    assert evaluation.ingest_beir_corpus(container, "fruit", beir / "corpus.jsonl") == 3
    assert evaluation.ingest_beir_corpus(container, "fruit", beir / "corpus.jsonl") == 0  # resumable, idempotent
    report = evaluation.evaluate(container, "fruit", beir / "queries.jsonl", beir / "qrels.tsv", k=10,
                                 modes=("keyword", "hybrid+rerank"))
    assert (report.queries_evaluated, report.queries_skipped) == (3, 1)
    kw, rr = report.modes
    # keyword rankings: q1 "banana" -> [d1]; q2 "date" -> [d2]; q4 "apple" -> [d3, d1] (d3 has apple twice).
    # q1: DCG 1, IDCG 1 + 1/log2(3); recall 1/2; MRR 1.  q2: all 0.  q4: nDCG 1/log2(3); recall 1; MRR 1/2.
    ndcg = (1 / (1 + 1 / math.log2(3)) + 0 + 1 / math.log2(3)) / 3
    assert kw.ndcg == pytest.approx(ndcg, abs=1e-4)
    assert kw.recall == pytest.approx(0.5, abs=1e-4) and kw.mrr == pytest.approx(0.5, abs=1e-4)
    assert kw.queries == 3 and kw.latency_p50_ms is not None
    # The default reranker cannot load offline: reported, not faked with unreranked numbers.
    assert rr.available is False and rr.ndcg is None and "unavailable" in rr.reason


def test_evaluate_bad_input(container, fake_embedder, beir, tmp_path):
    collections.create_collection(container, "fruit")
    with pytest.raises(QueryError, match="evaluation mode"):
        evaluation.evaluate(container, "fruit", beir / "queries.jsonl", beir / "qrels.tsv", modes=("fuzzy",))
    other = tmp_path / "other.tsv"
    other.write_text("query-id\tcorpus-id\tscore\nzz\td1\t1\n")
    with pytest.raises(QueryError, match="No judged query"):
        evaluation.evaluate(container, "fruit", beir / "queries.jsonl", other)
    from research_agent.errors import CollectionError

    with pytest.raises(CollectionError):
        evaluation.evaluate(container, "nope", beir / "queries.jsonl", beir / "qrels.tsv")


def test_evaluate_with_the_real_model_and_tiny_reranker(container, beir, tiny_cross_encoder, monkeypatch):
    monkeypatch.setattr(container.settings, "reranker_model", str(tiny_cross_encoder))
    collections.create_collection(container, "fruit")
    evaluation.ingest_beir_corpus(container, "fruit", beir / "corpus.jsonl")
    report = evaluation.evaluate(container, "fruit", beir / "queries.jsonl", beir / "qrels.tsv", k=3)
    assert [m.mode for m in report.modes] == list(evaluation.EVAL_MODES)
    for m in report.modes:
        assert m.available and 0.0 <= m.ndcg <= 1.0 and 0.0 <= m.recall <= 1.0 and 0.0 <= m.mrr <= 1.0
    # q1 "banana": every mode finds d1 (the only banana) first: MRR of q1 is 1, so the mean MRR >= 1/3.
    assert all(m.mrr >= 1 / 3 - 1e-9 for m in report.modes)
