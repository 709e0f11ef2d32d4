"""Ranking: which nodes a task nominates, how each is scored, and how the list is shaped and explained.

The score is a calibrated probability (scoring.py has the model and where it was fitted):

    odds = exp(logit(evidence)) * type_boost * status_boost * recency_boost * proximity_boost
    relevance_score = odds / (1 + odds)

The evidence per candidate node: its best cosine to the task, its gap to the other candidates, the
IDF-weighted share of the task's content words found in its text and in its title/header path, its
keyword (BM25) rank and relative BM25 score, whether it is a parent, whether it holds the task's
rarest word, and for a tool section (a `Parameters:` line) which way it runs a conversion the task asks for
and how many copies of it other servers list (direction.py; scoring.py). Boosts (boosts.py) multiply the
odds, so they reorder and nudge but cannot carry an unrelated node past the 0.5 line.

The stages, each a function here: nominate candidates (dense over the node index + the query
engine's keyword candidates), score them, collapse complementary siblings into their parent when most
of it matches, drop thin parents, keep parents behind their best child, sort, list down to LIST_FLOOR
(under the minimum score: priority "skip"), then word the reasons and the message.

Over 400 lines because the stages are one pipeline over one record (Scored) and one index: split apart,
every stage would import the others' internals; each stage is still a small function.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from research_agent.discovery import scoring
from research_agent.discovery.analysis import identifiers, terms
from research_agent.discovery.boosts import BoostRules, boosts_for
from research_agent.discovery.direction import direction, task_sides
from research_agent.discovery.models import Recommendation
from research_agent.discovery.node_index import Node, NodeIndex, ancestors, unit
from research_agent.text import surface_words

if TYPE_CHECKING:
    from research_agent.container import Container

# The protocol's thresholds.
MUST_LOAD, SHOULD_LOAD, CONSIDER = 0.9, 0.7, 0.5

# The cosine above which a reason says "semantically close" (MiniLM: ~0.55+ for a section written
# about the task, 0.3-0.45 for the same domain, < 0.25 for unrelated text).
CLOSE_COSINE = 0.42
# Children count as "matching equally" for the prefer-the-parent rule when their cosine is within this
# margin of the leading child's (MiniLM: sections about the same subject differ by < 0.1, a neighbouring
# subject by 0.15-0.3) and their score is at least COLLAPSE_MIN_SCORE, near the "consider" line (golden set:
# "error handling and logging" gives the logging section 0.45 and collapses; "a flaky test on CI" gives the
# fakes section 0.34 and must not); the leading child must score SHOULD_LOAD (0.7) or more.
COLLAPSE_MARGIN = 0.1
COLLAPSE_MIN_SCORE = 0.4
# A parent whose own text is shorter than this (a header and an intro line) is not worth loading
# alone: it is only recommended as a whole, when several of its children match.
THIN_NODE_TOKENS = 40
# "Prefer the parent" only when the close children are at least this share of all its children. Why:
# a catalog's server file has 5-60 tool sections; two matching tools of a 20-tool server are two tools,
# not a reason to load the server (31 of 139 top-3 answers on the ToolGym dev/test set were whole
# servers). A curated chapter with 2 of its 3 sections matching still collapses.
COLLAPSE_MIN_SHARE = 0.5
# Below the recommendation line (discovery_min_score, 0.5) the best candidates are still listed, marked
# priority "skip", down to this probability: the score is calibrated per answer, so on a 10,000-tool
# catalog with a dozen near-duplicate servers the right tool is often listed at 0.1-0.4 behind a look-alike
# (ToolGym dev: the right tool is in the top 10 for 23 of 26 tasks at a 0.05 floor, 20 at 0.1). Abstaining
# means "nothing scores 0.5 or more", and the message says so; 0.05 keeps the nearly hopeless out.
LIST_FLOOR = 0.05
MIN_TASK_TERMS = scoring.MIN_TASK_TERMS
# A code-like word of the task (`RESERVED_PREFIX`) nominates every node holding it when at most this many
# do: dense and BM25 candidates (40 chunks each) can miss the one file of 1,100 that defines it, and an
# identifier held by more nodes than this names no single one (its `identifier` weight is under 0.23).
IDENTIFIER_MAX_HOLDERS = 20
# When some node defines a task identifier, a node that only mentions it (a comment, prose, a call) gets this
# share of the 1 / sqrt(holders) weight, and the definers get 1 / sqrt(definers) (see _ident_evidence).
MENTION_SHARE = 0.5


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
    features: dict[str, float] = field(default_factory=dict)  # the calibration model's row (scoring.py)
    key_word: bool = False  # the node holds the task's rarest content word
    identifier: float = 0.0  # scoring.identifier_weight of the rarest task identifier the node holds
    matched_idents: list[str] = field(default_factory=list)  # those identifiers, as the task writes them
    task_terms: list[str] = field(default_factory=list)  # the task's distinct content words
    direction: float = 0.0  # direction.direction: the task's have/need sides against the tool's input/output


def priority(score: float) -> str:
    if score >= MUST_LOAD:
        return "must_load"
    if score >= SHOULD_LOAD:
        return "should_load"
    if score >= CONSIDER:
        return "consider"
    return "skip"


# -- candidates ----------------------------------------------------------------------------------------
@dataclass
class Nominated:
    """The nodes a task nominates: collection -> ids, and each keyword-nominated node's (rank, BM25)."""

    ids: dict[str, set[str]] = field(default_factory=dict)
    keyword: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)


def candidates(c: Container, task: str, indexes: list[NodeIndex], qvec: Any, n: int,
               timings: dict[str, float]) -> Nominated:
    """The nodes the task nominates (with their parents), and the keyword evidence of each.

    Hybrid: exact dense similarity over every chunk (the node index holds the vectors, so one matrix
    product replaces an approximate Chroma query and a second embedding of the task), plus the
    keyword (BM25) candidates of the query engine; a node's keyword rank is that of its best chunk.
    """
    from research_agent.ingest.nodes import STORED_KEYS
    from research_agent.search.retrieve import retrieve_candidates

    t = time.perf_counter()
    out = Nominated()
    for ix in indexes:
        for nid in ix.top_dense(qvec, n):
            _nominate(out.ids, ix, nid)
    _nominate_identifiers(out.ids, indexes, task)
    timings["dense"] = (time.perf_counter() - t) * 1000
    by_col = {ix.collection: ix for ix in indexes}
    names = [ix.collection for ix in indexes]
    for cand in retrieve_candidates(c, task, names, mode="keyword", n=n, timings=timings):
        ix = by_col.get(cand.metadata.get("collection"))
        nid = cand.metadata.get(STORED_KEYS["id"])
        if ix is not None and nid in ix.nodes:
            _nominate(out.ids, ix, nid)
            key = (ix.collection, nid)
            if key not in out.keyword:
                out.keyword[key] = (len(out.keyword) + 1, float(cand.keyword or 0.0))
    return out


def _nominate_identifiers(out: dict[str, set[str]], indexes: list[NodeIndex], task: str) -> None:
    """Every holder of a task identifier that at most IDENTIFIER_MAX_HOLDERS nodes hold (a dict lookup each)."""
    for ident in identifiers(task):
        for ix in indexes:
            holders = ix.ident_nodes.get(ident, ())
            if len(holders) <= IDENTIFIER_MAX_HOLDERS:
                for nid in holders:
                    _nominate(out, ix, nid)


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
    idents: dict[str, float] = field(default_factory=dict)  # task identifier -> scoring.identifier_weight
    ident_surface: dict[str, str] = field(default_factory=dict)  # task identifier -> as the task writes it
    # task identifiers some searched node defines -> the weight of a node that only mentions one
    mention: dict[str, float] = field(default_factory=dict)
    sides: tuple[list[str], list[str]] | None = None  # (have, need) stems of a conversion task (direction.py)


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
    written = identifiers(task)
    defined = {i for i in written if any(ix.ident_defs.get(i) for ix in indexes)}
    known = _rest_known(qterms, weight, df, written)
    idents = {i: known * scoring.identifier_weight(_ident_df(i, indexes, i in defined)) for i in written}
    mentions = {i: known * MENTION_SHARE * scoring.identifier_weight(_ident_df(i, indexes, False)) for i in defined}
    return _TaskWords(qterms, weight, total_weight or 1.0, surface_words(task, terms), idents, written, mentions,
                      task_sides(task))


def _ident_df(ident: str, indexes: list[NodeIndex], defined: bool) -> int:
    """How many nodes an identifier could name: those defining it when any does, else those holding it."""
    return sum(len((ix.ident_defs if defined else ix.ident_nodes).get(ident, ())) for ix in indexes)


def _rest_known(qterms: list[str], weight: dict[str, float], df: Counter, written: dict[str, str]) -> float:
    """The IDF-weighted share of the task's other content words (not the identifiers' parts) the base uses.

    Why: an identifier is evidence about the node only when the task is about what the base is about.
    "plan a wedding seating chart with RESERVED_PREFIX guests" named a real constant and scored 0.75
    (should_load) on our docs, though "wedding", "seating", "chart" and "guests" occur nowhere (issue 14,
    fourth round); "debug RESERVED_PREFIX validation" keeps the whole prior (both other words are known).
    A task of identifiers alone keeps it too (1.0).
    """
    parts = set(terms(" ".join(written.values())))
    rest = [t for t in qterms if t not in parts]
    total = sum(weight[t] for t in rest)
    if total <= 0:
        return 1.0
    return sum(weight[t] for t in rest if df[t] > 0) / total


def score_nodes(c: Container, task: str, indexes: list[NodeIndex], nominated: Nominated,
                qvec: Any, task_type: str | None, current_file: str | None) -> list[Scored]:
    """Every candidate node scored by the calibrated model (scoring.py) times its boosts, with its evidence."""
    words = _task_words(task, indexes)
    newest = max((ix.newest_checked for ix in indexes if ix.newest_checked), default=None)
    rules = BoostRules(boosts_for(c), task_type, current_file, newest)
    q = unit(qvec)
    out: list[Scored] = []
    for ix in indexes:
        for nid in nominated.ids.get(ix.collection, set()):
            node = ix.nodes.get(nid)
            if node is not None and node.rows:
                out.append(_evidence(ix, node, q, words, rules))
    calibrate(out, nominated.keyword)
    return out


def _evidence(ix: NodeIndex, node: Node, q: Any, words: _TaskWords, rules: BoostRules) -> Scored:
    """One node's own evidence (cosine, word coverage, boosts); the score comes from calibrate()."""
    dense = float((ix.matrix[node.rows] @ q).max())
    hit_body = [t for t in words.terms if t in node.terms]
    hit_title = [t for t in words.terms if t in node.title_terms]
    coverage = sum(words.weight[t] for t in hit_body) / words.total_weight
    title_cov = sum(words.weight[t] for t in hit_title) / words.total_weight
    surface = words.surface
    key = max(words.terms, key=lambda t: words.weight[t], default=None)
    named = sorted((i for i in words.idents if i in node.idents and words.idents[i] > 0),
                   key=lambda i: -_ident_evidence(i, node, words))
    return Scored(node, ix, 0.0, dense, coverage, title_cov,
                  [surface.get(t, t) for t in hit_title],
                  [surface.get(t, t) for t in sorted(hit_body, key=lambda t: -words.weight[t])],
                  rules.factors(node), key_word=key is not None and key in node.terms, task_terms=words.terms,
                  identifier=_ident_evidence(named[0], node, words) if named else 0.0,
                  matched_idents=[words.ident_surface[i] for i in named],
                  direction=direction(words.sides, node.sides, lambda t: words.weight.get(t, 0.0)))


def _ident_evidence(ident: str, node: Node, words: _TaskWords) -> float:
    """The `identifier` feature a node gets for one task identifier: less for a mere mention when a node defines it.

    Why: a weather module whose only mention of `compute_ledger_balance` was a TODO comment ranked first
    (0.737) over the file defining the function (0.647) for "fix compute_ledger_balance rounding" (issue 14,
    fourth round). A mention still counts (MENTION_SHARE): "where is max_query_chars enforced?" wants the
    code that checks the setting, not the settings class that defines it (our docs and code: the checking
    function 0.76 with the whole prior, 0.48 with none).
    """
    if ident in words.mention and ident not in node.defines:
        return words.mention[ident]
    return words.idents[ident]


def feature_rows(scored: list[Scored], keyword: dict[tuple[str, str], tuple[int, float]]) -> list[dict[str, float]]:
    """The model's feature row (scoring.FEATURES) of each candidate; set-level features read all of them."""
    keys = [_copy_key(s) for s in scored]
    margins = scoring.margins([s.dense for s in scored], keys, [s.direction >= 0 for s in scored])
    copies = Counter(keys)
    top_bm25 = max((bm for _, bm in keyword.values()), default=0.0)
    rows = []
    for s, margin, key in zip(scored, margins, keys):
        rank, bm25 = keyword.get((s.index.collection, s.node.id), (0, 0.0))
        rows.append({"dense": s.dense, "dense_sq": s.dense ** 2, "dense_margin": margin, "coverage": s.coverage,
                     "title_coverage": s.title_coverage, "kw_rr": 1.0 / rank if rank else 0.0,
                     "kw_rel": bm25 / top_bm25 if top_bm25 > 0 else 0.0,
                     "parent": 1.0 if s.node.children else 0.0, "key_word": 1.0 if s.key_word else 0.0,
                     "thin_task": scoring.thin_task(len(s.task_terms)), "breadth": scoring.breadth(len(s.node.terms)),
                     "direction": max(s.direction, 0.0), "against": max(-s.direction, 0.0),
                     "copies": scoring.copies(copies[key] - 1) if s.key_word else 0.0,
                     "tool": 1.0 if s.node.sides is not None else 0.0,
                     "identifier": s.identifier})
    return rows


def _copy_key(s: Scored) -> str:
    """Candidates with one key are copies of one thing (scoring.margins): leaf sections with the same title."""
    if s.node.children:
        return f"{s.index.collection}:{s.node.id}"
    return "title:" + "".join(ch for ch in s.node.title.lower() if ch.isalnum())


def calibrate(scored: list[Scored], keyword: dict[tuple[str, str], tuple[int, float]]) -> None:
    """Set each candidate's score: the fitted probability, its odds multiplied by the node's boosts."""
    for s, row in zip(scored, feature_rows(scored, keyword)):
        s.features = row
        z = scoring.logit(row) + sum(math.log(max(b, 1e-6)) for _, b in s.factors)
        s.score = scoring.sigmoid(z)


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
    """Make `parent` stand for its close children: two or more, most of its children, and small enough to load.

    "Close" is judged on the evidence, not the score: the calibrated score puts every runner-up well
    below the leader (its gap to the leader is a feature), so a second section the task names just as
    well ("error handling and logging": 0.88 and 0.45, cosines 0.67 and 0.60) would never look close.
    A close sibling must also match a task word the leader does not: the parent is worth loading when
    its sections answer different parts of the task, not when two tools of one server both say "Slack".
    Tool sections (a `Parameters:` line, node.sides) never count: a tool is called alone, so two matching
    tools of one server are a choice between them, not a server to read (ToolGym dev: a 3-tool PlantUML
    server stood at 0.90 for "encoded PlantUML ... need the plain source back", its decoder, the answer, gone).
    """
    kids = [k for k in kids if k.node.sides is None]
    if len(kids) < 2:
        return False
    lead = max(kids, key=lambda k: k.score)
    if lead.score < max(SHOULD_LOAD, min_score):
        return False
    close = [lead] + [k for k in kids if k is not lead and _complements(k, lead)]
    size = sum(n.own_tokens for n in parent.index.subtree(parent.node.id))
    share = len(close) / max(len(parent.node.children), 1)
    if len(close) < 2 or share < COLLAPSE_MIN_SHARE or size > max_tokens:
        return False
    parent.score = max(parent.score, lead.score)
    parent.include_children = True
    parent.collapsed = [k.node.title for k in sorted(close, key=lambda k: -k.score)]
    for k in close:
        parent.matched_title = list(dict.fromkeys(parent.matched_title + k.matched_title))
        parent.matched_body = list(dict.fromkeys(parent.matched_body + k.matched_body))
    return True


def _complements(kid: Scored, lead: Scored) -> bool:
    """`kid` matches about as well as the leading sibling and covers a task word the leader does not."""
    if kid.score < COLLAPSE_MIN_SCORE or kid.dense < lead.dense - COLLAPSE_MARGIN:
        return False
    return bool(set(kid.matched_title + kid.matched_body) - set(lead.matched_title + lead.matched_body))


def _behind_children(scored: list[Scored]) -> None:
    """A parent recommended alone never scores above its best-scoring child.

    Why: alone (include_children false) a parent is its own text only, a file's title and intro; when a
    section of it matches the task, that section is the answer. A catalog's server intro ("post messages
    to Slack channels") otherwise outranked the very tool it describes (ToolGym: 31 of 139 top-3 answers
    were server files). Ties go to the child (rank's sort key).
    """
    best: dict[tuple[str, str], float] = {}
    for s in scored:
        if s.node.parent_id:
            key = (s.index.collection, s.node.parent_id)
            best[key] = max(best.get(key, 0.0), s.score)
    for s in scored:
        kid = best.get((s.index.collection, s.node.id))
        if kid is not None and not s.include_children and s.score > kid:
            s.score = kid


def rank(scored: list[Scored], min_score: float, collapse_max_tokens: int) -> tuple[list[Scored], list[Scored]]:
    """(every node left after collapsing and dropping thin parents, best first; those worth listing).

    Listed: the nodes scoring LIST_FLOOR or more (or min_score, when it is set lower); those under
    min_score carry priority "skip" and do not count as available recommendations.
    """
    scored = collapse(scored, min_score, collapse_max_tokens)
    scored = [x for x in scored if x.include_children or not x.node.children or x.node.own_tokens >= THIN_NODE_TOKENS]
    _behind_children(scored)
    scored.sort(key=lambda x: (-x.score, bool(x.node.children) and not x.include_children,
                               x.node.source_document, x.node.id))
    floor = min(LIST_FLOOR, min_score)
    return scored, [x for x in scored if x.score >= floor]


# -- explaining -----------------------------------------------------------------------------------------
def reason(s: Scored) -> str:
    """Why the node is recommended, from what matched: title/body words, cosine, location, boosts."""
    parts: list[str] = []
    if s.matched_idents:
        parts.append("names " + ", ".join(f"'{w}'" for w in s.matched_idents[:3]))
    if s.collapsed:
        parts.append(
            f"{len(s.collapsed)} matching sections ({', '.join(s.collapsed[:3])}); retrieve with include_children"
        )
    if s.matched_title:
        parts.append("title matches " + ", ".join(f"'{w}'" for w in s.matched_title[:4]))
    elif s.matched_body:
        parts.append("content mentions " + ", ".join(f"'{w}'" for w in s.matched_body[:4]))
    if not s.matched_title and (s.dense >= CLOSE_COSINE or not s.matched_body):
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
    above = [r for r in recs if r.relevance_score >= min_score]
    if not above:
        best = _shown_below(max((x.score for x in scored), default=0.0), min_score)
        listed = ""
        if recs:
            nodes = "closest node is" if len(recs) == 1 else f"{len(recs)} closest nodes are"
            each = "" if len(recs) == 1 else "each "
            listed = (f" The {nodes} listed with priority 'skip' ({each}under {min_score:g}: probably not what "
                      "the task needs).")
        return (f"No knowledge relevant to this task was found (best match scored {best} < {min_score:g})."
                f"{listed} Proceed without loaded context, or try search_knowledge with the terms your "
                "documents use.")
    bands = Counter(r.priority for r in above)
    said = [f"{bands[k]} {label}" for k, label in (("must_load", "must load (>= 0.9)"),
                                                   ("should_load", "should load (0.7-0.9)"),
                                                   ("consider", "to consider (0.5-0.7)")) if bands[k]]
    if len(recs) > len(above):
        said.append(f"{len(recs) - len(above)} less likely (skip, < {min_score:g})")
    return f"{', '.join(said)}. {_advice(above)}"


def _shown_below(score: float, min_score: float) -> str:
    """`score` as the recommendations show it (3 decimals), cut down when rounding would reach `min_score`.

    Why: "{best:.2f}" printed 0.497 as "best match scored 0.50 < 0.5", a false comparison; the listed
    relevance_score is round(score, 3), so 0.497 reads the same in both places, and 0.4996 reads 0.499.
    """
    shown = round(score, 3)
    if shown >= min_score:
        shown = math.floor(score * 1000) / 1000
    return f"{shown:.3f}"


def empty_message(names: list[str]) -> str:
    """The answer when the collections searched hold no documents: say so, and how to fill them.

    Why: over an empty collection the abstention read "best match scored 0.00 < 0.5", as though the
    documents had been read and found irrelevant. It still opens as every abstention does, for callers that
    look for that phrase (tests/test_discovery.py::test_empty_store_and_empty_collection).
    """
    which = ", ".join(repr(n) for n in names)
    held = "collection holds" if len(names) == 1 else "collections hold"
    target = names[0] if len(names) == 1 else "NAME"
    return (f"No knowledge relevant to this task was found: the {held} no documents ({which}). Add documents with "
            f'`ingest_documents(path="PATH", collection="{target}")`, then call discover_context again.')


def _advice(above: list[Recommendation]) -> str:
    """Which ids to retrieve, true to the bands listed: those at 0.7 or more, else the 'consider' ones.

    Why: with only 'consider' items the advice used to say "the ids scoring 0.7 or more (about 0 tokens)",
    naming none of the ids listed.
    """
    children = ("; pass include_children=true for recommendations marked include_children."
                if any(r.include_children for r in above) else ".")
    sure = [r for r in above if r.relevance_score >= SHOULD_LOAD]
    if sure:
        tokens = sum(r.estimated_tokens for r in sure)
        return f"Call retrieve_knowledge with the ids scoring 0.7 or more (about {tokens} tokens){children}"
    tokens = sum(r.estimated_tokens for r in above)
    return (f"None is likely enough to load unread: read their reasons, then call retrieve_knowledge with the "
            f"'consider' ids that fit the task (about {tokens} tokens for all){children}")
