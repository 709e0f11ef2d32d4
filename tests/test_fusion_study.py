"""benchmarks/fusion_study.py `ceiling`: the bounds quoted for issue 12's SciFact target (benchmarks/README.md,
"Why SciFact hybrid fell from 0.736"): nDCG@10 at w = 0.5, at the best constant weight and at the oracle
weight per query, on a pool. Logic on a hand-made pool (no store): two queries whose relevant document only
one side ranks first, so no single weight serves both and only the per-query oracle ranks both first.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fusion_study.py"


@pytest.fixture()
def study(monkeypatch):
    spec = importlib.util.spec_from_file_location("fusion_study_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # [document, cosine, BM25, node]: a1 is dense's best, a2 keyword's best, a3 second on both sides.
    cands = [["a1", 1.0, 0.0, "n1"], ["a2", 0.0, 1.0, "n2"], ["a3", 0.5, 0.6, "n3"]]
    pool = [{"qid": "dense-wins", "qrels": {"a1": 1}, "cands": cands},
            {"qid": "keyword-wins", "qrels": {"a2": 1}, "cands": cands}]
    monkeypatch.setattr(mod, "load", lambda name, split: pool)
    return mod


def test_ceiling_orders_half_weight_best_constant_and_oracle(study, capsys):
    got = study.ceiling(["toy-dev"])["toy-dev"]
    # w = 0.5: a3 (0.55) leads; a1 ties a2 at 0.5 and comes second by pool order: 1/log2(3), then a2 third: 1/2.
    assert got["w0.5"] == pytest.approx((1 / math.log2(3) + 0.5) / 2, abs=1e-4)
    # Any constant puts one query's answer first and the other's third.
    assert got["best_constant"] == pytest.approx(0.75, abs=1e-4)
    assert not 0.45 <= got["best_w"] <= 0.54
    # The oracle picks each query's own weight: both answers first.
    assert got["oracle_per_query"] == pytest.approx(1.0)
    assert "toy-dev: w=0.5" in capsys.readouterr().out


def test_section_bm25_scores_a_section_as_one_text(study):
    """`qsections` scores a section's joined pieces: a claim whose words sit in two pieces matches the whole
    section; the score follows tantivy's BM25 (k1 1.2, b 0.75) with per-piece document frequencies."""
    df, n, avgdl = {"gene": 2, "rna": 1}, 10, 4.0
    # piece 1 holds "gene", piece 2 "rna": as one section (length 4) both terms count.
    joined = {"gene": 1, "rna": 1, "the": 2}
    norm = 1.2 * (1 - 0.75 + 0.75 * 4 / 4.0)
    idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
    expected = sum(idf[t] * 1 * 2.2 / (1 + norm) for t in ("gene", "rna"))
    assert study.section_bm25(["gene", "rna", "gene"], joined, df, n, avgdl) == pytest.approx(expected)
    assert study.section_bm25(["gene", "rna"], {"gene": 1, "the": 1}, df, n, avgdl) < expected
    assert study.section_bm25(["absent"], joined, df, n, avgdl) == 0.0


def test_section_arrays_give_each_piece_its_sections_evidence(study):
    """Ranked per section: a piece scored low by BM25 on its own ranks with its section's score, and the
    dense side takes the section's best cosine."""
    import numpy as np

    rec = {"qrels": {}, "cands": [["a", 0.9, 1.0, "s1", "a-0"], ["a", 0.2, 3.0, "s1", "a-1"],
                                  ["b", 0.5, 2.0, "s2", "b-0"]]}
    docs, d, k = study.section_arrays(rec, np.array([5.0, 5.0, 2.0]))
    assert docs == ["a", "a", "b"]
    assert d[:2] == pytest.approx([0.9, 0.9], abs=1e-5) and d[2] == pytest.approx(0.5, abs=1e-5)
    assert k == pytest.approx([5.0, 5.0, 2.0], abs=1e-4)


def test_dev_rule_needs_gain_margin_and_no_fall(study):
    """The qsections rule: +0.003 on the dev mean, 0.003 over the best single mode on every group, and no
    group more than 0.002 below the shipped fusion."""
    shipped, single = {"a": 0.70, "b": 0.59}, {"a": 0.65, "b": 0.585}
    assert study.passes_dev({"a": 0.71, "b": 0.59}, shipped, single)
    assert not study.passes_dev({"a": 0.704, "b": 0.59}, shipped, single)          # gain 0.002 only
    assert not study.passes_dev({"a": 0.72, "b": 0.587}, shipped, single)          # b within 0.003 of single
    assert not study.passes_dev({"a": 0.75, "b": 0.5875}, {"a": 0.70, "b": 0.5905}, {"a": 0.65, "b": 0.58})
