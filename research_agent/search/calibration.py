"""Calibrated relevance: every hit's `relevance_score` estimates the probability that the chunk is relevant.

Why: the raw scores mean different things per mode (a cosine of 0.4 is a good MiniLM hit, a BM25 of 12 is
unbounded, a fused score is min-max normalised per query so the top hit is always about 1), so labels and
refinement advice built on them misled (issue 12). A small logistic model per mode maps cheap per-hit
features to P(judged relevant); it was fitted on public train/dev judgments (SciFact train, NFCorpus
train + dev, CoSQA dev, and docs-QA dev: questions about our own docs, the quick start's kind of corpus;
never on a test split) by benchmarks/calibrate.py, which also reports the expected calibration error on the
test splits (SciFact 0.06-0.07, NFCorpus 0.03-0.07, CoSQA 0.07-0.19, docs-QA 0.10-0.11 by mode) and draws
benchmarks/reliability.png. Parameters ship in calibration.json beside
this module; scoring is a dot product and a sigmoid per hit (microseconds, no model).

Scores never rise down the returned list, and a hit's score does not depend on top_k: the scores are
computed over the first `retrieval_candidates` (50) fused hits whatever top_k is (search/service.py
`calibrated_order`). Keyword and hybrid keep the retrieval order, which ranks better (sorting keyword hits
by probability over that window cost 0.008-0.010 nDCG@10 on CoSQA dev and SciFact test, 0.047 on docs-QA
dev), and show the non-increasing sequence closest to the model's estimates (`descending`, pooled adjacent
violators). The running minimum used before let one weak hit at rank 3 print every later hit at its score:
the quick start's best answer read "0.043 Not Relevant" (own estimate 0.16), like six others.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from research_agent.text import DISCOVERY_STOP_WORDS, keyword_words, stemmer

#: Modes whose hits are returned sorted by their calibrated probability (ties in fused order). Semantic only:
#: there the model is monotone in the cosine, so sorting changes nothing but guarantees the order. Keyword was
#: sorted until its scores were computed over the 50-hit window: sorting that window cost nDCG@10 -0.008 CoSQA
#: dev, -0.010 SciFact test, -0.047 docs-QA dev (`benchmarks/calibrate.py --order`), while keeping BM25's
#: order with pooled scores has the same ECE (SciFact / NFCorpus / CoSQA / docs-QA test 0.084 / 0.055 /
#: 0.090 / 0.087 against 0.090 / 0.047 / 0.097 / 0.105 sorted). Hybrid: sorting cost 0.021 on CoSQA dev.
SORTED_MODES = frozenset({"semantic"})
#: Features a model may use, computed per hit from its retrieval evidence.
FEATURES = ("cosine", "bm25", "log_rank", "fused", "top_cosine", "top_bm25", "log_terms", "no_term", "coverage")
_TERM = re.compile(r"\w+")
#: Position-aware blend of a reranker's probability with the retrieval probability (weight of the reranker
#: by rank in the retrieval order): the top retrieval hits keep more of their own evidence, deeper ones
#: lean on the cross-encoder, which is where it adds most. A common choice for cross-encoder blending;
#: not fitted here (no pretrained cross-encoder loads offline).
RERANK_WEIGHT_BY_RANK = ((3, 0.5), (10, 0.6), (10**9, 0.7))


def bm25_squash(score: float) -> float:
    """BM25 scores are unbounded; squash so a few strong term matches approach 1 (8 is a typical top score)."""
    return 1.0 - math.exp(-max(0.0, score) / 8.0)


@lru_cache(maxsize=1)
def parameters() -> dict[str, Any]:
    """The shipped calibration (research_agent/search/calibration.json)."""
    return json.loads(resources.files("research_agent.search").joinpath("calibration.json").read_text(encoding="utf-8"))


def query_terms(query: str) -> int:
    """Word count of the query (at least 1)."""
    return max(1, len(_TERM.findall(query or "")))


@lru_cache(maxsize=4096)
def _stems(text: str) -> frozenset[str]:
    """Distinct keyword stems of a text; cached because a query scores the same chunks again and again."""
    words = keyword_words(text or "")
    return frozenset(stemmer().stemWords(words)) if words else frozenset()


@lru_cache(maxsize=256)
def _query_stems(query: str) -> frozenset[str]:
    """The query's content-word stems (see `coverage`); cached: every hit of a query asks for them."""
    words = keyword_words(query)
    content = [w for w in words if w not in DISCOVERY_STOP_WORDS] or words
    return frozenset(stemmer().stemWords(content)) if content else frozenset()


def coverage(query: str, text: str | None) -> float:
    """Share of the query's distinct content-word stems found in `text` (keyword_words, as BM25 sees them,
    minus question words such as "how", "do", "what": text.DISCOVERY_STOP_WORDS; all of them if none is left).

    Why: BM25 of one shared word can be as high as that of a full match in a small corpus, so "best recipe
    for banana bread" hitting a page that says "best" scored 0.24-0.32 in keyword mode; coverage 1/4 tells
    it from an on-topic hit (issue 12). No text (a caller that has none): 1.0 if the hit matched a term.
    """
    wanted = _query_stems(query or "")
    if not wanted or text is None:
        return float("nan")
    return len(wanted & _stems(text)) / len(wanted)


def hit_features(dense: Sequence[float | None], keyword: Sequence[float | None],
                 fused: Sequence[float], query: str = "",
                 texts: Sequence[str | None] | None = None) -> list[dict[str, float]]:
    """Feature rows for hits in their returned order (rank 1 first); query-level features are list maxima
    and the query's length: a short topical query ("vitamin d") has many relevant documents (NFCorpus: ~38
    judged per 2-3 word query), a long specific claim one or two (SciFact: 12 words, 1.1 judged)."""
    cos = [max(-1.0, min(1.0, d)) if d is not None else 0.0 for d in dense]
    bm = [bm25_squash(k) if k is not None else 0.0 for k in keyword]
    top_cos, top_bm, log_terms = max(cos, default=0.0), max(bm, default=0.0), math.log(query_terms(query))
    texts = list(texts) if texts is not None else [None] * len(bm)
    rows = []
    for rank, (c, b, f, t) in enumerate(zip(cos, bm, fused, texts), start=1):
        cov = coverage(query, t)
        rows.append({"cosine": c, "bm25": b, "log_rank": math.log(rank), "fused": f, "top_cosine": top_cos,
                     "top_bm25": top_bm, "log_terms": log_terms, "no_term": 0.0 if b > 0 else 1.0,
                     "coverage": (1.0 if b > 0 else 0.0) if math.isnan(cov) else cov})
    return rows


def probability(mode: str, row: dict[str, float], params: dict[str, Any] | None = None) -> float:
    """P(relevant) of one hit under the mode's logistic model.

    A model with `stacks` (hybrid) also reads the logits of the named models' probabilities for the same
    hit (`logit_semantic`, `logit_keyword`). Why: a hybrid logistic on the raw cosine, BM25 and fused score
    scored an off-topic licence page with no query term in it 0.37 ("Somewhat Relevant"); stacking the two
    calibrated estimates, plus whether the hit contains any query term, gives 0.17 (benchmarks/README.md).
    """
    params = params or parameters()
    model = params["models"][mode]
    stacked = {f"logit_{m}": _logit(probability(m, row, params)) for m in model.get("stacks", ())}
    z = model["intercept"] + sum(w * (stacked[name] if name in stacked else row[name])
                                 for name, w in zip(model["features"], model["coef"]))
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def _logit(p: float) -> float:
    p = min(1.0 - 1e-9, max(1e-9, p))
    return math.log(p / (1.0 - p))


def descending(scores: Sequence[float]) -> list[float]:
    """The non-increasing sequence closest to `scores` in squared error (pooled adjacent violators), so the
    list reads in its order and a hit ranked under a weaker one shares their mean instead of being pulled
    down to it. On the test pools, hybrid (cap -> this): ECE SciFact 0.059 -> 0.078, NFCorpus 0.052 ->
    0.031, CoSQA 0.065 -> 0.103, docs-QA 0.131 -> 0.103 (mean 0.077 -> 0.079), while fewer judged-relevant
    hits read "Not Relevant" on every set (16/26/39/42 % -> 13/19/30/40 %)."""
    blocks: list[list[float]] = []  # [sum, count] per pooled run
    for s in scores:
        blocks.append([s, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def probabilities(mode: str, dense: Sequence[float | None], keyword: Sequence[float | None],
                  fused: Sequence[float], params: dict[str, Any] | None = None, query: str = "",
                  texts: Sequence[str | None] | None = None) -> list[float]:
    """The model's own probability of each hit, features taken in the retrieval (fused) order; no cap."""
    return [probability(mode, r, params) for r in hit_features(dense, keyword, fused, query, texts)]


def calibrated_scores(mode: str, dense: Sequence[float | None], keyword: Sequence[float | None],
                      fused: Sequence[float], params: dict[str, Any] | None = None, query: str = "",
                      texts: Sequence[str | None] | None = None) -> list[float]:
    """Calibrated, non-increasing relevance probabilities of hits kept in their fused order (hybrid)."""
    return descending(probabilities(mode, dense, keyword, fused, params, query, texts))


def rerank_weight(retrieval_rank: int) -> float:
    for upto, weight in RERANK_WEIGHT_BY_RANK:
        if retrieval_rank <= upto:
            return weight
    return RERANK_WEIGHT_BY_RANK[-1][1]


def blend_rerank(retrieval_probability: float, rerank_probability: float, retrieval_rank: int) -> float:
    """A reranker's probability (sigmoid of its logit) blended into the calibrated scale, position-aware."""
    w = rerank_weight(retrieval_rank)
    return w * rerank_probability + (1.0 - w) * retrieval_probability


def label(probability_: float, settings: Any) -> str:
    """The label band of a calibrated probability (thresholds from settings, compared with the probability)."""
    if probability_ >= settings.threshold_highly_relevant:
        return "Highly Relevant"
    if probability_ >= settings.threshold_relevant:
        return "Relevant"
    if probability_ >= settings.threshold_somewhat_relevant:
        return "Somewhat Relevant"
    return "Not Relevant"
