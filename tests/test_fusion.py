"""Hybrid never worse than its best part: the per-query dense weight of convex fusion (issue 12).

The weight (research_agent.search.retrieve.adaptive_dense_weight) leans on dense when keyword evidence is weak and
on BM25 when its top score is strong; 0 and 1 stay pure keyword / dense; semantic and keyword modes
do not fuse at all. Figures behind the constants: benchmarks/README.md, "Three public sets, three modes".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections
from research_agent.search import service as query
from research_agent.search.retrieve import Candidate, adaptive_dense_weight, fuse_convex, fusion_scores

DENSE = [0.62, 0.55, 0.41, 0.38, 0.30]


def test_weight_is_a_probability_and_the_setting_is_its_prior():
    strong_bm25, no_bm25 = [14.0, 3.0, 2.0, 1.0, 0.5], [0.0] * 5
    w_strong, w_none = adaptive_dense_weight(DENSE, strong_bm25), adaptive_dense_weight(DENSE, no_bm25)
    assert 0.0 < w_strong < w_none < 1.0
    assert w_none > 0.5  # no query term matched anywhere: trust dense
    # The setting shifts the weight on the logit scale; 0 and 1 stay pure keyword and pure dense.
    assert adaptive_dense_weight(DENSE, strong_bm25, 0.8) > w_strong > adaptive_dense_weight(DENSE, strong_bm25, 0.2)
    assert adaptive_dense_weight(DENSE, strong_bm25, 0.0) == 0.0
    assert adaptive_dense_weight(DENSE, strong_bm25, 1.0) == 1.0


def test_pure_weights_rank_like_one_retriever():
    bm25 = [0.5, 9.0, 3.0, 0.0, 7.0]
    order = lambda scores: sorted(range(len(scores)), key=lambda i: -scores[i])  # noqa: E731
    assert order(fusion_scores(DENSE, bm25, 1.0)) == order(DENSE)
    assert order(fusion_scores(DENSE, bm25, 0.0)) == order(bm25)


def test_degenerate_pools_fall_back_sensibly():
    assert fusion_scores([], []) == []
    assert adaptive_dense_weight([], [], 0.5) == 0.5
    one = fusion_scores([0.4], [3.0])
    assert len(one) == 1 and 0.0 <= one[0] <= 1.0
    # Every BM25 score zero (keyword list empty): the fused order is the dense order.
    fused = fusion_scores(DENSE[::-1], [0.0] * 5)
    assert sorted(range(5), key=lambda i: -fused[i]) == [4, 3, 2, 1, 0]


def test_fuse_convex_uses_the_adaptive_weight_unless_told_not_to():
    def pool():
        return [Candidate("a", "", {}, dense=0.62, keyword=0.0), Candidate("b", "", {}, dense=0.45, keyword=14.0),
                Candidate("c", "", {}, dense=0.30, keyword=2.0)]

    w = adaptive_dense_weight([0.62, 0.45, 0.30], [0.0, 14.0, 2.0], 0.5)
    adaptive = {x.id: x.fused for x in fuse_convex(pool(), 0.5)}
    fixed = {x.id: x.fused for x in fuse_convex(pool(), 0.5, adaptive=False)}
    assert adaptive["a"] == pytest.approx(w) and fixed["a"] == pytest.approx(0.5)
    assert adaptive["b"] == pytest.approx((1 - w) + w * (0.45 - 0.30) / (0.62 - 0.30))


# -- with the real model --------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def real_kb(container, tmp_path):
    collections.create_collection(container, "docs")
    folder = tmp_path / "kb"
    _write(folder / "soup.md", "# Tomato soup\n\nSimmer tomatoes with basil and garlic, then blend until smooth.\n")
    _write(folder / "birds.md", "# Garden birds\n\nRobins and blue tits visit feeders in winter.\n")
    _write(folder / "deploy.md", "# Shipping the service\n\nBuild the container image and roll it out to the "
           "cluster with a rolling update.\n")
    _write(folder / "cache.py", "def cached(fn):\n    \"\"\"Memoise fn by its arguments.\"\"\"\n    store = {}\n\n"
           "    def wrapper(*args):\n        if args not in store:\n            store[args] = fn(*args)\n"
           "        return store[args]\n    return wrapper\n")
    ingest.ingest_path(container, str(folder), "docs", recursive=True)
    return container


@pytest.mark.slow
def test_hybrid_without_any_keyword_match_ranks_like_semantic(real_kb):
    # No query term occurs in any chunk: the keyword side is empty and hybrid must not scramble dense's order.
    q = "how do we deploy?"
    sem = query.retrieve_candidates(real_kb, q, ["docs"], mode="semantic", n=10)
    hyb = query.retrieve_candidates(real_kb, q, ["docs"], mode="hybrid", n=10)
    assert not query.retrieve_candidates(real_kb, q, ["docs"], mode="keyword", n=10)
    assert [x.id for x in hyb] == [x.id for x in sem]
    assert all(0.0 <= x.fused <= 1.0 for x in hyb)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["semantic", "keyword"])
def test_single_retriever_modes_do_not_fuse(real_kb, mode):
    out = query.retrieve_candidates(real_kb, "memoise a function by its arguments", ["docs"], mode=mode, n=10)
    assert out
    raw = [x.dense if mode == "semantic" else x.keyword for x in out]
    assert [x.fused for x in out] == raw and raw == sorted(raw, reverse=True)
