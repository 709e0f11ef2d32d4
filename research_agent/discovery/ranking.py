"""Ranking: which nodes a task nominates, how each is scored, and how the list is shaped and explained.

With no pretrained cross-encoder offline, the score is a calibrated logistic model over evidence we
do have (docs/discovery.md has the long version):

    z = A * (dense - D0) + B * coverage + C * title_coverage
    odds = exp(z) * type_boost * status_boost * recency_boost * proximity_boost
    relevance_score = odds / (1 + odds)

`dense` is the best cosine between the task and the node's chunks (MiniLM: ~0.55+ for a section
written about the task, 0.3-0.45 for the same domain, < 0.25 for unrelated text); `coverage` is the
IDF-weighted share of the task's content words found in the node, `title_coverage` the share found
in its title and header path. Boosts (boosts.py) multiply the odds, so they reorder and nudge but
cannot carry an unrelated node past the 0.5 line.

The stages, each a function here: nominate candidates (dense over the node index + the query
engine's keyword candidates), score them, collapse close siblings into their parent, drop thin
parents, sort and cut at the minimum score, then word the reasons and the message.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from research_agent.discovery.analysis import surface_words, terms
from research_agent.discovery.boosts import BoostRules, boosts_for
from research_agent.discovery.models import Recommendation
from research_agent.discovery.node_index import Node, NodeIndex, ancestors, unit

# The protocol's thresholds.
MUST_LOAD, SHOULD_LOAD, CONSIDER = 0.9, 0.7, 0.5

# Calibration (see the module docstring and docs/discovery.md). D0 is the cosine at which dense
# evidence alone is a coin flip; A says how fast it moves: cos 0.60 alone gives 0.83, 0.30 gives 0.25.
CAL_A = 9.0
CAL_D0 = 0.42
CAL_B = 1.5     # every content word of the task found in the node: odds x4.5
CAL_C = 1.0     # ... and in its title/header path too: another x2.7
# Children count as "matching equally" for the prefer-the-parent rule within this score margin.
COLLAPSE_MARGIN = 0.1
# A parent whose own text is shorter than this (a header and an intro line) is not worth loading
# alone: it is only recommended as a whole, when several of its children match.
THIN_NODE_TOKENS = 40
MIN_TASK_TERMS = 3


@dataclass
class Scored:
    node: Node
    index: NodeIndex
    score: float
    dense: float
    coverage: float
    title_coverage: float
    matched_title: list[str]
    matched_body: list[str]
    factors: list[tuple[str, float]]
    include_children: bool = False
    collapsed: list[str] = field(default_factory=list)


def priority(score: float) -> str:
    if score >= MUST_LOAD:
        return "must_load"
    if score >= SHOULD_LOAD:
        return "should_load"
    if score >= CONSIDER:
        return "consider"
    return "skip"


# -- candidates ----------------------------------------------------------------------------------------
def candidates(c, task: str, indexes: list[NodeIndex], qvec: Any, n: int,
               timings: dict[str, float]) -> dict[str, set[str]]:
    """Collection -> ids of the nodes the task nominates (with their parents).

    Hybrid: exact dense similarity over every chunk (the node index holds the vectors, so one matrix
    product replaces an approximate Chroma query and a second embedding of the task), plus the
    keyword (BM25) candidates of the query engine.
    """
    from research_agent.query import retrieve_candidates

    t = time.perf_counter()
    out: dict[str, set[str]] = {}
    for ix in indexes:
        for nid in ix.top_dense(qvec, n):
            _nominate(out, ix, nid)
    timings["dense"] = (time.perf_counter() - t) * 1000
    by_col = {ix.collection: ix for ix in indexes}
    names = [ix.collection for ix in indexes]
    for cand in retrieve_candidates(c, task, names, mode="keyword", n=n, timings=timings):
        ix = by_col.get(cand.metadata.get("collection"))
        if ix is not None:
            _nominate(out, ix, cand.metadata.get("node_id"))
    return out


def _nominate(out: dict[str, set[str]], ix: NodeIndex, nid: str | None) -> None:
    if nid not in ix.nodes:
        return
    ids = out.setdefault(ix.collection, set())
    ids.add(nid)
    # Parents come along so that "prefer the parent" can compare them with their children.
    parent = ix.nodes[nid].parent_id
    if parent in ix.nodes:
        ids.add(parent)


# -- scoring --------------------------------------------------------------------------------------------
@dataclass
class _TaskWords:
    """The task's stemmed content words with their IDF weights over the searched collections."""

    terms: list[str]
    weight: dict[str, float]
    total_weight: float
    surface: dict[str, str]


def _task_words(task: str, indexes: list[NodeIndex]) -> _TaskWords:
    qterms = list(dict.fromkeys(terms(task)))
    n_total = sum(len(ix.nodes) for ix in indexes) or 1
    df: Counter = Counter()
    for ix in indexes:
        df.update({t: ix.df.get(t, 0) for t in qterms})
    # A task word found nowhere weighs as much as the rarest word: words the knowledge base never
    # uses are evidence that it does not cover the task.
    weight = {t: math.log(1 + n_total / max(df[t], 1)) for t in qterms}
    # One or two content words are thin evidence ("add an endpoint" covers every node that says
    # endpoint): a task shorter than MIN_TASK_TERMS counts as padded with unknown words.
    total_weight = sum(weight.values()) + max(0, MIN_TASK_TERMS - len(qterms)) * math.log(1 + n_total)
    return _TaskWords(qterms, weight, total_weight or 1.0, surface_words(task))


def score_nodes(c, task: str, indexes: list[NodeIndex], candidate_ids: dict[str, set[str]],
                qvec: Any, task_type: str | None, current_file: str | None) -> list[Scored]:
    """Every candidate node scored by the calibrated model (module docstring), with its evidence."""
    words = _task_words(task, indexes)
    newest = max((ix.newest_checked for ix in indexes if ix.newest_checked), default=None)
    rules = BoostRules(boosts_for(c), task_type, current_file, newest)
    q = unit(qvec)
    out: list[Scored] = []
    for ix in indexes:
        for nid in candidate_ids.get(ix.collection, set()):
            node = ix.nodes.get(nid)
            if node is not None and node.rows:
                out.append(_score_node(ix, node, q, words, rules))
    return out


def _score_node(ix: NodeIndex, node: Node, q: Any, words: _TaskWords, rules: BoostRules) -> Scored:
    dense = float((ix.matrix[node.rows] @ q).max())
    hit_body = [t for t in words.terms if t in node.terms]
    hit_title = [t for t in words.terms if t in node.title_terms]
    coverage = sum(words.weight[t] for t in hit_body) / words.total_weight
    title_cov = sum(words.weight[t] for t in hit_title) / words.total_weight
    z = CAL_A * (dense - CAL_D0) + CAL_B * coverage + CAL_C * title_cov
    factors = rules.factors(node)
    for _, b in factors:
        z += math.log(max(b, 1e-6))
    score = 1.0 / (1.0 + math.exp(-z))
    surface = words.surface
    return Scored(node, ix, score, dense, coverage, title_cov,
                  [surface.get(t, t) for t in hit_title],
                  [surface.get(t, t) for t in sorted(hit_body, key=lambda t: -words.weight[t])],
                  factors)


# -- shaping the list -------------------------------------------------------------------------------------
def collapse(scored: list[Scored], min_score: float, max_tokens: int) -> list[Scored]:
    """Prefer the parent when several of its children match about equally; never one node twice."""
    by_key = {(s.index.collection, s.node.id): s for s in scored}
    parents: dict[tuple[str, str], list[Scored]] = {}
    for s in scored:
        if s.node.parent_id and (s.index.collection, s.node.parent_id) in by_key:
            parents.setdefault((s.index.collection, s.node.parent_id), []).append(s)

    def depth(key: tuple[str, str]) -> int:
        ix = by_key[key].index
        return len(ancestors(ix.nodes, ix.nodes[key[1]]))

    removed: set[tuple[str, str]] = set()
    # Deepest parents first, so a collapsed section can itself collapse into its document.
    for key in sorted(parents, key=depth, reverse=True):
        kids = [k for k in parents[key] if (k.index.collection, k.node.id) not in removed]
        parent = by_key[key]
        if _absorb(parent, kids, min_score, max_tokens):
            removed.update((parent.index.collection, n.id) for n in parent.index.subtree(parent.node.id)[1:])
    return [s for s in scored if (s.index.collection, s.node.id) not in removed]


def _absorb(parent: Scored, kids: list[Scored], min_score: float, max_tokens: int) -> bool:
    """Make `parent` stand for its close children when two or more match and it is small enough to load."""
    if len(kids) < 2:
        return False
    best = max(k.score for k in kids)
    close = [k for k in kids if k.score >= max(SHOULD_LOAD, min_score, best - COLLAPSE_MARGIN)]
    size = sum(n.own_tokens for n in parent.index.subtree(parent.node.id))
    if len(close) < 2 or size > max_tokens:
        return False
    parent.score = max(parent.score, best)
    parent.include_children = True
    parent.collapsed = [k.node.title for k in sorted(close, key=lambda k: -k.score)]
    for k in close:
        parent.matched_title = list(dict.fromkeys(parent.matched_title + k.matched_title))
        parent.matched_body = list(dict.fromkeys(parent.matched_body + k.matched_body))
    return True


def rank(scored: list[Scored], min_score: float, collapse_max_tokens: int) -> tuple[list[Scored], list[Scored]]:
    """(every node left after collapsing and dropping thin parents, best first; those scoring min_score+)."""
    scored = collapse(scored, min_score, collapse_max_tokens)
    scored = [x for x in scored if x.include_children or not x.node.children or x.node.own_tokens >= THIN_NODE_TOKENS]
    scored.sort(key=lambda x: (-x.score, x.node.source_document, x.node.id))
    return scored, [x for x in scored if x.score >= min_score]


# -- explaining -----------------------------------------------------------------------------------------
def reason(s: Scored) -> str:
    """Why the node is recommended, from what matched: title/body words, cosine, location, boosts."""
    parts: list[str] = []
    if s.collapsed:
        parts.append(f"{len(s.collapsed)} matching sections ({', '.join(s.collapsed[:3])}); retrieve with include_children")
    if s.matched_title:
        parts.append("title matches " + ", ".join(f"'{w}'" for w in s.matched_title[:4]))
    elif s.matched_body:
        parts.append("content mentions " + ", ".join(f"'{w}'" for w in s.matched_body[:4]))
    if not s.matched_title and (s.dense >= CAL_D0 or not s.matched_body):
        parts.append(f"semantically close (cosine {s.dense:.2f})")
    # The header path, led by the document title unless the top header repeats it.
    location = " > ".join(dict.fromkeys(p for p in (s.node.document_title, *s.node.header_path.split(" > ")) if p))
    if location:
        parts.append(f"in {location}")
    parts += [label for label, b in s.factors if abs(b - 1.0) > 1e-9]
    return "; ".join(parts)


def estimated_tokens(index: NodeIndex, node: Node, include_children: bool) -> int:
    if not include_children:
        return node.own_tokens
    return sum(n.own_tokens for n in index.subtree(node.id))


def _qualified_ids(indexes: list[NodeIndex]) -> set[str]:
    """Node ids that exist in more than one of the collections: those are written collection:node_id."""
    seen: Counter = Counter()
    for ix in indexes:
        seen.update(ix.nodes.keys())
    return {nid for nid, n in seen.items() if n > 1}


def recommendations(relevant: list[Scored], indexes: list[NodeIndex], max_results: int) -> list[Recommendation]:
    """The wire recommendations for the best `max_results` nodes."""
    qualify = _qualified_ids(indexes)
    recs = []
    for x in relevant[:max_results]:
        rid = f"{x.index.collection}:{x.node.id}" if x.node.id in qualify else x.node.id
        score = round(x.score, 3)
        recs.append(Recommendation(
            id=rid, path=x.node.path, title=x.node.title, type=x.node.eff_type, relevance_score=score,
            reason=reason(x), estimated_tokens=estimated_tokens(x.index, x.node, x.include_children),
            collection=x.index.collection, priority=priority(score), include_children=x.include_children,
        ))
    return recs


def message(recs: list[Recommendation], scored: list[Scored], min_score: float) -> str:
    """What the caller should do next: which bands to load and how many tokens, or that nothing matched."""
    if not recs:
        best = max((x.score for x in scored), default=0.0)
        return (f"No knowledge relevant to this task was found (best match scored {best:.2f} < {min_score:g}). "
                "Proceed without loaded context, or try search_knowledge with the terms your documents use.")
    bands = Counter(r.priority for r in recs)
    said = [f"{bands[k]} {label}" for k, label in (("must_load", "must load (>= 0.9)"),
                                                   ("should_load", "should load (0.7-0.9)"),
                                                   ("consider", "to consider (0.5-0.7)")) if bands[k]]
    tokens = sum(r.estimated_tokens for r in recs if r.priority != "consider")
    return (f"{', '.join(said)}. Call retrieve_knowledge with the ids scoring 0.7 or more "
            f"(about {tokens} tokens); pass include_children=true for recommendations marked include_children.")
