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
