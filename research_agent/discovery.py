"""Discovery: "what do I need to know to do X?" over knowledge nodes (the Meta MCP Agent protocol).

A *node* is a section of an ingested document with its own id (the Markdown-JSON hybrid format's
`- id:` bullet, or the id the chunker derives from the header path). Chunks are the unit of
retrieval; nodes are the unit of recommendation: discovery aggregates chunks to nodes, scores each
node, and recommends ids that `retrieve_knowledge` returns reassembled in document order.

Scoring (docs/discovery.md has the long version). With no pretrained cross-encoder offline, the
score is a calibrated logistic model over evidence we do have:

    z = A * (dense - D0) + B * coverage + C * title_coverage
    odds = exp(z) * type_boost * status_boost * recency_boost * proximity_boost
    relevance_score = odds / (1 + odds)

`dense` is the best cosine between the task and the node's chunks (MiniLM: ~0.55+ for a section
written about the task, 0.3-0.45 for the same domain, < 0.25 for unrelated text); `coverage` is the
IDF-weighted share of the task's content words found in the node, `title_coverage` the share found
in its title and header path. Boosts from `task_boosts.yaml` multiply the odds, so they reorder and
nudge but cannot carry an unrelated node past the 0.5 line.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from research_agent.errors import CollectionError, ConfigError, DocumentError, QueryError

log = logging.getLogger(__name__)

TASK_TYPES = ("implement", "debug", "refactor", "document", "review", "design", "test")
FORMATS = ("markdown", "json", "plain")
DIRECTIONS = ("upstream", "downstream", "both")
SEARCH_TYPES = ("hybrid", "semantic", "keyword")
BOOSTS_FILE = Path(__file__).with_name("task_boosts.yaml")

# The protocol's thresholds.
MUST_LOAD, SHOULD_LOAD, CONSIDER = 0.9, 0.7, 0.5

# Calibration (see the module docstring and docs/discovery.md). D0 is the cosine at which dense
# evidence alone is a coin flip; A says how fast it moves: cos 0.60 alone gives 0.83, 0.30 gives 0.25.
CAL_A = 9.0
CAL_D0 = 0.42
CAL_B = 1.5     # every content word of the task found in the node: odds x4.5
CAL_C = 1.0     # ... and in its title/header path too: another x2.7
# Defaults of the proposed settings (read with getattr until config.py has them).
DEFAULT_CANDIDATES = 40
DEFAULT_COLLAPSE_MAX_TOKENS = 3000
# Children count as "matching equally" for the prefer-the-parent rule within this score margin.
COLLAPSE_MARGIN = 0.1
# A parent whose own text is shorter than this (a header and an intro line) is not worth loading
# alone: it is only recommended as a whole, when several of its children match.
THIN_NODE_TOKENS = 40
MIN_TASK_TERMS = 3

_PAGE = 5000
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+")
_STOP = frozenset("""
a about above after again all also an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further had has have having here how i if in into is it
its itself just me more most my no nor not now of off on once only or other our ours out over own same should so
some such than that the their them then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours
add adding make making write writing create implement new find decide ensure get use using need needs want sure
change changes way ways thing things sometimes since without within across via per one two etc
""".split())


# -- models (the wire shapes: .model_dump(mode="json")) -------------------------------------------------
class Recommendation(BaseModel):
    id: str
    path: str
    title: str
    type: str | None
    relevance_score: float
    reason: str
    estimated_tokens: int
    #: Extras beyond the protocol's fields: where the node lives, the threshold band, and whether the
    #: recommendation stands for the node with its sub-sections (then estimated_tokens counts them).
    collection: str
    priority: Literal["must_load", "should_load", "consider", "skip"]
    include_children: bool = False


class DiscoveryResult(BaseModel):
    recommendations: list[Recommendation]
    total_available: int
    message: str
    task_type: str | None = None
    collections: list[str] = []
    timings_ms: dict[str, float] = {}


class Section(BaseModel):
    header_path: str
    content_type: str
    code_language: str | None = None
    text: str


class KnowledgeNode(BaseModel):
    id: str
    collection: str
    path: str
    title: str
    metadata: dict[str, Any]
    content: str
    sections: list[Section] | None = None  # format=json
    tokens: int
    children: list["KnowledgeNode"] = []


class RetrievalResult(BaseModel):
    nodes: list[KnowledgeNode]
    total_tokens: int
    format: str
    not_found: list[str] = []
    message: str = ""


class NodeSummary(BaseModel):
    id: str
    path: str
    title: str
    type: str | None
    status: str | None
    last_checked: str | None


class KnowledgeBase(BaseModel):
    id: str
    collection: str
    path: str
    title: str
    type: str | None
    status: str | None
    description: str
    last_checked: str | None
    node_count: int
    nodes: list[NodeSummary]


class KnowledgeBaseList(BaseModel):
    knowledge_bases: list[KnowledgeBase]
    total_files: int
    total_nodes: int


class DependencyNode(BaseModel):
    id: str
    collection: str
    path: str
    title: str
    type: str | None
    status: str | None
    distance: int


class DependencyEdge(BaseModel):
    #: `source` depends on `target`: source is blocked_by target, or source is a child_of target.
    source: str
    target: str
    kind: Literal["blocked_by", "child_of"]


class DependencyGraph(BaseModel):
    node: DependencyNode
    direction: str
    depth: int
    depth_capped: bool = False
    nodes: list[DependencyNode]
    edges: list[DependencyEdge]
    cycles: list[list[str]] = []
    missing: list[str] = Field(default_factory=list, description="blocked_by ids that match no node")


# -- the node index: one per collection, rebuilt when the collection's revision moves ----------------------
@dataclass
class Node:
    collection: str
    id: str
    source_document: str
    document_title: str
    header_path: str
    anchor: str
    type: str | None
    status: str | None
    parent_id: str | None
    blocked_by: list[str]
    last_checked: str | None
    labels: list[str]
    description: str
    chunks: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # (seq, text, metadata)
    rows: list[int] = field(default_factory=list)  # rows of the index's embedding matrix
    children: list[str] = field(default_factory=list)
    title_terms: frozenset[str] = frozenset()
    terms: frozenset[str] = frozenset()
    # filled after the tree is known
    eff_type: str | None = None
    eff_status: str | None = None
    eff_last_checked: str | None = None
    own_tokens: int = 0
    explicit_title: str | None = None  # a `- title:` bullet, once ingest stores it as node_title

    @property
    def title(self) -> str:
        if self.explicit_title:
            return self.explicit_title
        if self.header_path:
            return self.header_path.rsplit(" > ", 1)[-1]
        return self.document_title or self.source_document

    @property
    def path(self) -> str:
        return f"{self.source_document}#{self.anchor}" if self.anchor else self.source_document

    def markdown(self) -> str:
        return "\n\n".join(text for _, text, _ in self.chunks)


@dataclass
class NodeIndex:
    collection: str
    nodes: dict[str, Node]
    order: list[str]                       # document order
    matrix: Any                            # numpy (chunks x dim), L2-normalised
    df: Counter                            # term -> number of nodes containing it
    blocks: dict[str, list[str]]           # id -> ids whose blocked_by names it
    documents: dict[str, list[str]]        # source_document -> node ids in order
    newest_checked: date | None = None
    row_nodes: list[str] = field(default_factory=list)  # matrix row -> node id

    def top_dense(self, qvec: Any, n: int) -> list[str]:
        """Ids of the nodes owning the `n` chunks most similar to the (unit) query vector."""
        import numpy as np

        if not len(self.matrix) or not self.row_nodes:
            return []
        sims = self.matrix @ qvec
        k = min(n, len(sims))
        top = np.argpartition(-sims, k - 1)[:k]
        return list(dict.fromkeys(self.row_nodes[i] for i in top[np.argsort(-sims[top])]))

    def subtree(self, node_id: str) -> list[Node]:
        out: list[Node] = []
        stack = [node_id]
        seen: set[str] = set()
        while stack:
            nid = stack.pop()
            if nid in seen or nid not in self.nodes:
                continue
            seen.add(nid)
            node = self.nodes[nid]
            out.append(node)
            stack.extend(reversed(node.children))
        return out


_cache: dict[tuple[str, str], tuple[int, NodeIndex]] = {}
_cache_lock = threading.Lock()


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def terms(text: str) -> list[str]:
    """Stemmed content words of `text` (lowercase, stop words and one-letter words dropped)."""
    words = [w.lower() for w in _WORD.findall(text)]
    words = [w for w in words if w not in _STOP]
    return _stemmer().stemWords(words) if words else []


def _first_sentence(text: str, header_line: bool = True) -> str:
    lines = text.split("\n")
    if header_line and lines and lines[0].lstrip().startswith("#"):
        lines = lines[1:]
    body = " ".join(line.strip() for line in lines if line.strip() and not line.strip().startswith(("```", "|")))
    m = re.search(r"(.{20,}?[.!?])(\s|$)", body)
    sentence = m.group(1) if m else body
    return sentence[:240]


def _parse_date(value: str | None) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(str(value)[:10])
    except ValueError:
        return None


def _build_index(c, collection: str, col: Any) -> NodeIndex:
    import numpy as np

    manifests = c.store.registry_find("document", collection)
    current = {m["document"]: m["content_hash"] for m in manifests.values()}
    doc_order = sorted(current)
    rank = {d: i for i, d in enumerate(doc_order)}
    rows: list[tuple[int, int, str, str, dict[str, Any], Any]] = []
    offset = 0
    while True:
        res = col.get(include=["documents", "metadatas", "embeddings"], limit=_PAGE, offset=offset)
        embeddings = res["embeddings"]
        for i, (doc, meta) in enumerate(zip(res["documents"], res["metadatas"])):
            source = meta.get("source_document")
            if current.get(source) == meta.get("content_hash"):
                rows.append((rank[source], int(meta.get("chunk_sequence_id", 0)), source, doc, meta, embeddings[i]))
        if len(res["ids"]) < _PAGE:
            break
        offset += _PAGE
    rows.sort(key=lambda r: (r[0], r[1]))
    nodes: dict[str, Node] = {}
    order: list[str] = []
    documents: dict[str, list[str]] = {}
    vectors = []
    for row_no, (_, seq, source, text, meta, vec) in enumerate(rows):
        vectors.append(vec)
        nid = meta.get("node_id") or f"{source}#{meta.get('anchor', '')}"
        node = nodes.get(nid)
        if node is None:
            node = nodes[nid] = Node(
                collection=collection, id=nid, source_document=source,
                document_title=meta.get("document_title", ""), header_path=meta.get("header_path", ""),
                anchor=meta.get("anchor", ""), type=meta.get("node_type"), status=meta.get("status"),
                parent_id=meta.get("parent_id"), blocked_by=list(meta.get("blocked_by") or []),
                last_checked=meta.get("last_checked"), labels=list(meta.get("labels") or []),
                description=meta.get("node_description")
                or (meta.get("description", "") if not meta.get("header_path") else ""),
                explicit_title=meta.get("node_title"),
            )
            order.append(nid)
            documents.setdefault(source, []).append(nid)
        elif node.source_document != source:
            # The same explicit id in two files: the first file keeps it (ids must be unique).
            log.warning("node id %r appears in %s and %s; keeping the first", nid, node.source_document, source)
            continue
        node.chunks.append((seq, text, meta))
        node.rows.append(row_no)
    matrix = np.asarray(vectors, dtype="float32") if vectors else np.zeros((0, 1), dtype="float32")
    if len(matrix):
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True).clip(min=1e-12)
    df: Counter = Counter()
    blocks: dict[str, list[str]] = {}
    newest: date | None = None
    for nid in order:
        node = nodes[nid]
        if node.parent_id and node.parent_id in nodes and node.parent_id != nid:
            nodes[node.parent_id].children.append(nid)
        for dep in node.blocked_by:
            blocks.setdefault(dep, []).append(nid)
        text = node.markdown()
        if not node.description:
            node.description = _first_sentence(text)
        node.own_tokens = _tokens(text)
        title_text = " ".join([node.header_path or node.document_title, " ".join(node.labels)])
        node.title_terms = frozenset(terms(title_text))
        node.terms = frozenset(terms(text)) | node.title_terms | frozenset(terms(node.document_title))
        df.update(node.terms)
        checked = _parse_date(node.last_checked)
        if checked and (newest is None or checked > newest):
            newest = checked
    for nid in order:  # inherit type, status and last_checked from the nearest ancestor that has them
        node = nodes[nid]
        chain = _ancestors(nodes, node)
        node.eff_type = next((n.type for n in chain if n.type), None)
        node.eff_status = next((n.status for n in chain if n.status), None)
        node.eff_last_checked = next((n.last_checked for n in chain if n.last_checked), None)
    row_nodes = [""] * len(rows)
    for nid in order:
        for r in nodes[nid].rows:
            row_nodes[r] = nid
    return NodeIndex(collection, nodes, order, matrix, df, blocks, documents, newest, row_nodes)


def _ancestors(nodes: dict[str, Node], node: Node) -> list[Node]:
    """The node, its parent, its parent's parent ... (cycle-safe)."""
    chain, seen = [], set()
    while node is not None and node.id not in seen:
        chain.append(node)
        seen.add(node.id)
        node = nodes.get(node.parent_id) if node.parent_id else None
    return chain


def node_index(c, collection: str) -> NodeIndex:
    """The cached node index of a collection; rebuilt when its revision moved (any process's write)."""
    from research_agent.collections import open_collection

    col = open_collection(c, collection, check_model=False)
    key = (c.store.location, str(col.id))
    rev = c.store.revision(collection)
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] == rev:
            return hit[1]
    index = _build_index(c, collection, col)
    with _cache_lock:
        _cache[key] = (rev, index)
    return index


def _unit(vec: Any) -> Any:
    import numpy as np

    q = np.asarray(vec, dtype="float32")
    return q / max(float(np.linalg.norm(q)), 1e-12)


def _tokens(text: str) -> int:
    from research_agent.chunking import estimate_tokens

    return estimate_tokens(text)


# -- boosts ---------------------------------------------------------------------------------------------
def load_boosts(path: Path | str | None = None) -> dict[str, Any]:
    """The packaged boost file, overlaid with the user's file (keys left out keep the defaults)."""
    import yaml

    data = yaml.safe_load(BOOSTS_FILE.read_text(encoding="utf-8"))
    if path:
        p = Path(path).expanduser()
        try:
            user = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"Cannot read the discovery boosts file {p}: {exc.strerror}",
                              guidance="Fix RESEARCH_AGENT_DISCOVERY_BOOSTS_FILE or remove it.") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"The discovery boosts file {p} is not valid YAML: {exc}",
                              guidance="Fix the YAML syntax (see research_agent/task_boosts.yaml).") from None
        if not isinstance(user, dict):
            raise ConfigError(f"The discovery boosts file {p} must hold a mapping",
                              guidance="Start from a copy of research_agent/task_boosts.yaml.")
        data = _merge(data, user)
        bad = [key for key, value in _leaves(data) if isinstance(value, bool) or not isinstance(value, (int, float))
               or value <= 0]
        if bad:
            raise ConfigError(f"The discovery boosts file {p} has values that are not positive numbers: "
                              f"{', '.join(bad[:5])}", guidance="Every boost is a positive number (1.0 = no change).")
    return data


def _leaves(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), data)]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_boost_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def _boosts(c) -> dict[str, Any]:
    path = c.settings.discovery_boosts_file
    key = str(path or "")
    mtime = Path(path).expanduser().stat().st_mtime if path and Path(path).expanduser().exists() else 0.0
    hit = _boost_cache.get(key)
    if hit and hit[0] == mtime:
        return hit[1]
    data = load_boosts(path)
    _boost_cache[key] = (mtime, data)
    return data


# -- discover_context --------------------------------------------------------------------------------------
@dataclass
class _Scored:
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


def _validate_task(task: Any, settings: Any) -> str:
    if not isinstance(task, str) or not task.strip():
        raise QueryError("The task description is empty", guidance="Describe the task you are about to do.")
    if len(task) > settings.max_query_chars:
        raise QueryError(f"The task description has {len(task)} characters; the limit is {settings.max_query_chars}",
                         guidance="Summarise the task in a few sentences.")
    return task.strip()


def _validate_task_type(task_type: str | None) -> str | None:
    if task_type is None or task_type == "":
        return None
    if task_type not in TASK_TYPES:
        raise QueryError(f"Unknown task_type {task_type!r}", guidance=f"Use one of: {', '.join(TASK_TYPES)}.",
                         allowed=list(TASK_TYPES))
    return task_type


def _proximity(node: Node, current_file: str | None, boosts: dict[str, Any]) -> tuple[str, float] | None:
    if not current_file:
        return None
    prox = boosts.get("proximity", {})
    cur = PurePosixPath(str(current_file).replace("\\", "/").lstrip("./"))
    src = PurePosixPath(node.source_document)
    # Document keys are relative to the ingested folder's parent and current_file to the workspace:
    # compare by path suffix, so `repo/docs/a.md` and `docs/a.md` are the same file.
    def suffix_match(a: PurePosixPath, b: PurePosixPath) -> bool:
        n = min(len(a.parts), len(b.parts))
        return n > 0 and a.parts[-n:] == b.parts[-n:]

    if suffix_match(cur, src):
        return "same file as current_file", float(prox.get("same_file", 1.0))
    if len(cur.parts) > 1 and len(src.parts) > 1 and suffix_match(cur.parent, src.parent):
        return "same directory as current_file", float(prox.get("same_directory", 1.0))
    names = set(terms(" ".join(list(cur.parent.parts[-3:]) + [cur.stem])))
    node_words = set(terms(" ".join([node.source_document, node.header_path, " ".join(node.labels)])))
    if names & node_words:
        return f"path of current_file mentions {', '.join(sorted(names & node_words)[:2])}", \
            float(prox.get("path_terms", 1.0))
    return None


def _score_nodes(c, task: str, indexes: list[NodeIndex], candidate_ids: dict[str, set[str]],
                 qvec: Any, task_type: str | None, current_file: str | None) -> list[_Scored]:
    import numpy as np

    boosts = _boosts(c)
    qterms = list(dict.fromkeys(terms(task)))
    surface: dict[str, str] = {}
    for word in _WORD.findall(task):
        st = terms(word)
        if st:
            surface.setdefault(st[0], word.lower())
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
    total_weight = total_weight or 1.0
    newest = max((ix.newest_checked for ix in indexes if ix.newest_checked), default=None)
    row = boosts.get("task_types", {}).get(task_type or "", {}) if task_type else {}
    default_boost = float(boosts.get("default", 1.0))
    status_boosts = {str(k).lower(): float(v) for k, v in (boosts.get("status") or {}).items()}
    rec = boosts.get("recency", {})
    q = _unit(qvec)
    out: list[_Scored] = []
    for ix in indexes:
        ids = candidate_ids.get(ix.collection, set())
        if not ids:
            continue
        for nid in ids:
            node = ix.nodes.get(nid)
            if node is None or not node.rows:
                continue
            dense = float((ix.matrix[node.rows] @ q).max())
            hit_body = [t for t in qterms if t in node.terms]
            hit_title = [t for t in qterms if t in node.title_terms]
            coverage = sum(weight[t] for t in hit_body) / total_weight
            title_cov = sum(weight[t] for t in hit_title) / total_weight
            z = CAL_A * (dense - CAL_D0) + CAL_B * coverage + CAL_C * title_cov
            factors: list[tuple[str, float]] = []
            if task_type:
                b = float(row.get(node.eff_type or "", default_boost))
                factors.append((f"{node.eff_type or 'untyped'} x{b:g} for {task_type}", b))
            if node.eff_status:
                b = status_boosts.get(node.eff_status.lower(), 1.0)
                factors.append((f"status {node.eff_status}", b))
            checked = _parse_date(node.eff_last_checked)
            if checked and newest:
                age = (newest - checked).days
                if age <= int(rec.get("fresh_days", 120)):
                    factors.append(("recently checked", float(rec.get("fresh", 1.0))))
                elif age > int(rec.get("stale_days", 365)):
                    factors.append((f"last checked {checked.isoformat()}", float(rec.get("stale", 1.0))))
            prox = _proximity(node, current_file, boosts)
            if prox:
                factors.append(prox)
            for _, b in factors:
                z += math.log(max(b, 1e-6))
            score = 1.0 / (1.0 + math.exp(-z))
            out.append(_Scored(node, ix, score, dense, coverage, title_cov,
                               [surface.get(t, t) for t in hit_title],
                               [surface.get(t, t) for t in sorted(hit_body, key=lambda t: -weight[t])],
                               factors))
    return out


def _collapse(scored: list[_Scored], min_score: float, max_tokens: int) -> list[_Scored]:
    """Prefer the parent when several of its children match about equally; never one node twice."""
    by_key = {(s.index.collection, s.node.id): s for s in scored}
    # Deepest parents first, so a collapsed section can itself collapse into its document.
    parents: dict[tuple[str, str], list[_Scored]] = {}
    for s in scored:
        if s.node.parent_id and (s.index.collection, s.node.parent_id) in by_key:
            parents.setdefault((s.index.collection, s.node.parent_id), []).append(s)

    def depth(key: tuple[str, str]) -> int:
        ix = by_key[key].index
        return len(_ancestors(ix.nodes, ix.nodes[key[1]]))

    removed: set[tuple[str, str]] = set()
    for key in sorted(parents, key=depth, reverse=True):
        kids = [k for k in parents[key] if (k.index.collection, k.node.id) not in removed]
        if len(kids) < 2:
            continue
        best = max(k.score for k in kids)
        close = [k for k in kids if k.score >= max(SHOULD_LOAD, min_score, best - COLLAPSE_MARGIN)]
        parent = by_key[key]
        size = sum(n.own_tokens for n in parent.index.subtree(parent.node.id))
        if len(close) < 2 or size > max_tokens:
            continue
        parent.score = max(parent.score, best)
        parent.include_children = True
        parent.collapsed = [k.node.title for k in sorted(close, key=lambda k: -k.score)]
        for k in close:
            parent.matched_title = list(dict.fromkeys(parent.matched_title + k.matched_title))
            parent.matched_body = list(dict.fromkeys(parent.matched_body + k.matched_body))
        for n in parent.index.subtree(parent.node.id)[1:]:
            removed.add((parent.index.collection, n.id))
    return [s for s in scored if (s.index.collection, s.node.id) not in removed]


def _reason(s: _Scored) -> str:
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


def _estimated_tokens(index: NodeIndex, node: Node, include_children: bool) -> int:
    if not include_children:
        return node.own_tokens
    return sum(n.own_tokens for n in index.subtree(node.id))


def _qualified_ids(indexes: list[NodeIndex]) -> set[str]:
    """Node ids that exist in more than one of the collections: those are written collection:node_id."""
    seen: Counter = Counter()
    for ix in indexes:
        seen.update(ix.nodes.keys())
    return {nid for nid, n in seen.items() if n > 1}


def discover_context(c, task_description: str, *, task_type: str | None = None, current_file: str | None = None,
                     max_results: int = 5, collections: list[str] | None = None,
                     project: str | None = None) -> DiscoveryResult:
    """A ranked, explained reading list of knowledge nodes for a task (scores 0..1, < 0.5 left out)."""
    from research_agent.query import resolve_collections, retrieve_candidates

    s = c.settings
    t0 = time.perf_counter()
    task = _validate_task(task_description, s)
    task_type = _validate_task_type(task_type)
    if not isinstance(max_results, int) or not 1 <= max_results <= s.max_top_k:
        raise QueryError(f"max_results must be between 1 and {s.max_top_k}", guidance="Pass a smaller --max-results.")
    c.store.refresh()
    names = resolve_collections(c, collections, project)
    timings: dict[str, float] = {}
    indexes = [node_index(c, name) for name in names]
    timings["index"] = (time.perf_counter() - t0) * 1000
    n_cand = s.discovery_candidates
    # Hybrid candidates: exact dense similarity over every chunk (the node index holds the vectors,
    # so one matrix product replaces an approximate Chroma query and a second embedding of the task),
    # plus the keyword (BM25) candidates of the query engine.
    t = time.perf_counter()
    qvec = _unit(c.embedder.embed_query(task))
    timings["embed"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    candidate_ids: dict[str, set[str]] = {}

    def add(ix: NodeIndex, nid: str | None) -> None:
        if nid not in ix.nodes:
            return
        ids = candidate_ids.setdefault(ix.collection, set())
        ids.add(nid)
        # Parents come along so that "prefer the parent" can compare them with their children.
        parent = ix.nodes[nid].parent_id
        if parent in ix.nodes:
            ids.add(parent)

    for ix in indexes:
        for nid in ix.top_dense(qvec, n_cand):
            add(ix, nid)
    timings["dense"] = (time.perf_counter() - t) * 1000
    by_col = {ix.collection: ix for ix in indexes}
    for cand in retrieve_candidates(c, task, names, mode="keyword", n=n_cand, timings=timings):
        ix = by_col.get(cand.metadata.get("collection"))
        if ix is not None:
            add(ix, cand.metadata.get("node_id"))
    t = time.perf_counter()
    scored = _score_nodes(c, task, indexes, candidate_ids, qvec, task_type, current_file)
    min_score = s.discovery_min_score
    collapse_tokens = s.discovery_collapse_max_tokens
    scored = _collapse(scored, min_score, collapse_tokens)
    scored = [x for x in scored if x.include_children or not x.node.children or x.node.own_tokens >= THIN_NODE_TOKENS]
    scored.sort(key=lambda x: (-x.score, x.node.source_document, x.node.id))
    relevant = [x for x in scored if x.score >= min_score]
    qualify = _qualified_ids(indexes)
    recs = []
    for x in relevant[:max_results]:
        rid = f"{x.index.collection}:{x.node.id}" if x.node.id in qualify else x.node.id
        score = round(x.score, 3)
        recs.append(Recommendation(
            id=rid, path=x.node.path, title=x.node.title, type=x.node.eff_type, relevance_score=score,
            reason=_reason(x), estimated_tokens=_estimated_tokens(x.index, x.node, x.include_children),
            collection=x.index.collection, priority=priority(score), include_children=x.include_children,
        ))
    timings["score"] = (time.perf_counter() - t) * 1000
    timings["total"] = (time.perf_counter() - t0) * 1000
    return DiscoveryResult(recommendations=recs, total_available=len(relevant),
                           message=_message(recs, scored, min_score), task_type=task_type, collections=names,
                           timings_ms={k: round(v, 1) for k, v in timings.items()})


def _message(recs: list[Recommendation], scored: list[_Scored], min_score: float) -> str:
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


# -- retrieve_knowledge --------------------------------------------------------------------------------
def _indexes(c, collections: list[str] | None, project: str | None = None) -> list[NodeIndex]:
    from research_agent.query import resolve_collections

    c.store.refresh()
    return [node_index(c, name) for name in resolve_collections(c, collections, project)]


def _resolve(indexes: list[NodeIndex], ident: str) -> tuple[list[tuple[NodeIndex, Node]], str | None]:
    """Matches of an id (`node_id` or `collection:node_id`) and, when it is ambiguous, why."""
    if ":" in ident:
        col, _, nid = ident.partition(":")
        for ix in indexes:
            if ix.collection == col and nid in ix.nodes:
                return [(ix, ix.nodes[nid])], None
    found = [(ix, ix.nodes[ident]) for ix in indexes if ident in ix.nodes]
    if len(found) > 1:
        options = ", ".join(f"{ix.collection}:{ident}" for ix, _ in found)
        return found, f"{ident!r} exists in several collections; use one of {options}"
    return found, None


_PLAIN_RULES = [
    (re.compile(r"^ {0,3}#{1,6}\s*", re.M), ""),
    (re.compile(r"^ {0,3}(```|~~~).*$\n?", re.M), ""),
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?!\w)"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"<!--.*?-->", re.S), ""),
]


def to_plain(markdown: str) -> str:
    """Markdown without its markup: headers, emphasis, links and fences go, their text stays."""
    text = markdown
    for pattern, repl in _PLAIN_RULES:
        text = pattern.sub(repl, text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _metadata(node: Node) -> dict[str, Any]:
    return {"type": node.type, "status": node.status, "parent_id": node.parent_id, "blocked_by": node.blocked_by,
            "last_checked": node.last_checked, "labels": node.labels, "header_path": node.header_path,
            "source_document": node.source_document, "document_title": node.document_title,
            "anchor": node.anchor, "description": node.description, "children": list(node.children),
            "effective_type": node.eff_type, "effective_status": node.eff_status}


def _render(index: NodeIndex, node: Node, fmt: str, include_children: bool) -> KnowledgeNode:
    markdown = node.markdown()
    sections = None
    if fmt == "json":
        sections = [Section(header_path=m.get("header_path", ""), content_type=m.get("content_type", "prose"),
                            code_language=m.get("code_language"), text=text) for _, text, m in node.chunks]
        content = ""
        tokens = sum(_tokens(s.text) for s in sections)
    elif fmt == "plain":
        content = to_plain(markdown)
        tokens = _tokens(content)
    else:
        content = markdown
        tokens = node.own_tokens
    children = [_render(index, index.nodes[k], fmt, True) for k in node.children if k in index.nodes] \
        if include_children else []
    return KnowledgeNode(id=node.id, collection=node.collection, path=node.path, title=node.title,
                         metadata=_metadata(node), content=content, sections=sections, tokens=tokens,
                         children=children)


def _total_tokens(nodes: list[KnowledgeNode]) -> int:
    return sum(n.tokens + _total_tokens(n.children) for n in nodes)


def retrieve_knowledge(c, ids: list[str], *, include_children: bool = False, format: str = "markdown",
                       collections: list[str] | None = None) -> RetrievalResult:
    """Full content of nodes, reassembled from their chunks in document order.

    Unknown ids do not cost the caller the ones that exist: found nodes are returned with the rest
    listed in `not_found`; only when no id is found at all is it a DocumentError (listing them).
    """
    s = c.settings
    if isinstance(ids, str):
        ids = [ids]
    ids = list(dict.fromkeys(i.strip() for i in (ids or []) if isinstance(i, str) and i.strip()))
    if not ids:
        raise QueryError("No ids given", guidance="Pass the ids that discover_context recommended.")
    if len(ids) > s.max_retrieve_ids:
        raise QueryError(f"{len(ids)} ids requested; at most {s.max_retrieve_ids} per call",
                         guidance="Split the ids over several calls or raise RESEARCH_AGENT_MAX_RETRIEVE_IDS.",
                         limit=s.max_retrieve_ids)
    if format not in FORMATS:
        raise QueryError(f"Unknown format {format!r}", guidance=f"Use one of: {', '.join(FORMATS)}.")
    indexes = _indexes(c, collections)
    nodes: list[KnowledgeNode] = []
    not_found: list[str] = []
    problems: list[str] = []
    for ident in ids:
        found, ambiguity = _resolve(indexes, ident)
        if ambiguity:
            problems.append(ambiguity)
            not_found.append(ident)
        elif not found:
            not_found.append(ident)
        else:
            ix, node = found[0]
            nodes.append(_render(ix, node, format, include_children))
    if not nodes:
        raise DocumentError(f"No node found for: {', '.join(not_found)}",
                            guidance="Use ids from discover_context or list_knowledge_bases"
                            + (f" ({'; '.join(problems)})" if problems else "") + ".",
                            not_found=not_found)
    message = ""
    if not_found:
        message = f"Not found: {', '.join(not_found)}" + (f" ({'; '.join(problems)})" if problems else "")
    return RetrievalResult(nodes=nodes, total_tokens=_total_tokens(nodes), format=format, not_found=not_found,
                           message=message)


# -- list_knowledge_bases ------------------------------------------------------------------------------
def list_knowledge_bases(c, *, filter_type: str | None = None, filter_status: str | None = None,
                         collections: list[str] | None = None) -> KnowledgeBaseList:
    """The catalogue of ingested files with their nodes (filters match a node's own or inherited type/status)."""
    try:
        indexes = _indexes(c, collections)
    except CollectionError:
        if collections:
            raise
        return KnowledgeBaseList(knowledge_bases=[], total_files=0, total_nodes=0)
    bases: list[KnowledgeBase] = []
    for ix in indexes:
        for source, nids in ix.documents.items():
            all_nodes = [ix.nodes[n] for n in nids]
            nodes = [n for n in all_nodes
                     if (not filter_type or (n.eff_type or "").lower() == filter_type.lower())
                     and (not filter_status or (n.eff_status or "").lower() == filter_status.lower())]
            if not nodes:
                continue
            root = next((n for n in all_nodes if not n.parent_id or n.parent_id not in ix.nodes), all_nodes[0])
            dates = [d for d in (n.last_checked for n in all_nodes) if _parse_date(d)]
            bases.append(KnowledgeBase(
                id=root.id, collection=ix.collection, path=source, title=root.document_title or root.title,
                type=root.eff_type, status=root.eff_status, description=root.description,
                last_checked=max(dates, key=lambda d: _parse_date(d)) if dates else None, node_count=len(nodes),
                nodes=[NodeSummary(id=n.id, path=n.path, title=n.title, type=n.eff_type, status=n.eff_status,
                                   last_checked=n.eff_last_checked) for n in nodes],
            ))
    return KnowledgeBaseList(knowledge_bases=bases, total_files=len(bases),
                             total_nodes=sum(b.node_count for b in bases))


# -- search_knowledge ---------------------------------------------------------------------------------
def search_knowledge(c, query: str, *, search_type: str = "hybrid", scope: str | list[str] | None = None,
                     max_results: int = 10):
    """query.query_knowledge scoped to knowledge collections: `scope` is collection names or a project name."""
    from research_agent.query import query_knowledge

    if search_type not in SEARCH_TYPES:
        raise QueryError(f"Unknown search_type {search_type!r}", guidance=f"Use one of: {', '.join(SEARCH_TYPES)}.")
    collections, project = None, None
    if isinstance(scope, str):
        scope = [p.strip() for p in scope.split(",") if p.strip()]
    if scope:
        if len(scope) == 1 and not c.store.has_collection(scope[0]) \
                and c.store.registry_get([f"project:{scope[0]}"]):
            project = scope[0]
        else:
            collections = scope
    return query_knowledge(c, query, collections=collections, project=project, top_k=max_results, mode=search_type)


# -- get_dependencies --------------------------------------------------------------------------------
def _dep_node(ix: NodeIndex, node: Node, distance: int) -> DependencyNode:
    return DependencyNode(id=node.id, collection=ix.collection, path=node.path, title=node.title,
                          type=node.eff_type, status=node.eff_status, distance=distance)


def get_dependencies(c, node_id: str, *, direction: str = "both", depth: int = 1,
                     collections: list[str] | None = None) -> DependencyGraph:
    """Nodes reached through blocked_by and parent/child links, breadth first, cycle-safe."""
    s = c.settings
    if direction not in DIRECTIONS:
        raise QueryError(f"Unknown direction {direction!r}", guidance=f"Use one of: {', '.join(DIRECTIONS)}.")
    if not isinstance(depth, int) or depth < 1:
        raise QueryError("depth must be 1 or more", guidance="Pass --depth 1 for direct links.")
    capped = depth > s.max_dependency_depth
    depth = min(depth, s.max_dependency_depth)
    if not isinstance(node_id, str) or not node_id.strip():
        raise QueryError("No node id given", guidance="Pass a node id from discover_context or list_knowledge_bases.")
    indexes = _indexes(c, collections)
    found, ambiguity = _resolve(indexes, node_id.strip())
    if ambiguity:
        raise QueryError(ambiguity, guidance="Qualify the id with its collection.")
    if not found:
        raise DocumentError(f"No node found for: {node_id}", guidance="Use an id from list_knowledge_bases.",
                            not_found=[node_id])
    root_ix, root = found[0]

    def lookup(ix: NodeIndex, nid: str) -> tuple[NodeIndex, Node] | None:
        if nid in ix.nodes:  # the same collection first, then the others
            return ix, ix.nodes[nid]
        for other in indexes:
            if nid in other.nodes:
                return other, other.nodes[nid]
        return None

    def neighbours(ix: NodeIndex, node: Node) -> list[tuple[str, str, str, str]]:
        """(neighbour id, edge source, edge target, kind)"""
        out = []
        if direction in ("upstream", "both"):
            out += [(dep, node.id, dep, "blocked_by") for dep in node.blocked_by]
            if node.parent_id:
                out.append((node.parent_id, node.id, node.parent_id, "child_of"))
        if direction in ("downstream", "both"):
            for other in indexes:
                out += [(dep, dep, node.id, "blocked_by") for dep in other.blocks.get(node.id, [])]
            out += [(kid, kid, node.id, "child_of") for kid in node.children]
        return out

    key = (root_ix.collection, root.id)
    visited: dict[tuple[str, str], int] = {key: 0}
    nodes: list[DependencyNode] = []
    edges: list[DependencyEdge] = []
    seen_edges: set[tuple[str, str, str]] = set()
    missing: list[str] = []
    frontier = [(root_ix, root)]
    for distance in range(1, depth + 1):
        nxt = []
        for ix, node in frontier:
            for nid, src, dst, kind in neighbours(ix, node):
                hit = lookup(ix, nid)
                if hit is None:
                    if nid not in missing:
                        missing.append(nid)
                    continue
                if (src, dst, kind) not in seen_edges:
                    seen_edges.add((src, dst, kind))
                    edges.append(DependencyEdge(source=src, target=dst, kind=kind))
                hkey = (hit[0].collection, hit[1].id)
                if hkey not in visited:  # a node already reached (a cycle, or two paths) is not expanded again
                    visited[hkey] = distance
                    nodes.append(_dep_node(hit[0], hit[1], distance))
                    nxt.append(hit)
        frontier = nxt
    return DependencyGraph(node=_dep_node(root_ix, root, 0), direction=direction, depth=depth, depth_capped=capped,
                           nodes=nodes, edges=edges, cycles=_cycles(edges), missing=missing)


def _cycles(edges: list[DependencyEdge]) -> list[list[str]]:
    """Cycles among the blocked_by edges found (each once, starting at its smallest id)."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        if e.kind == "blocked_by":
            graph.setdefault(e.source, []).append(e.target)
    cycles: set[tuple[str, ...]] = set()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, []):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):]
                i = cyc.index(min(cyc))
                cycles.add(tuple(cyc[i:] + cyc[:i]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in list(graph):
        if n not in state:
            visit(n)
    return [list(c) for c in sorted(cycles)]


# -- MCP resources and prompts --------------------------------------------------------------------------
RESOURCE_TEMPLATE = "knowledge://{collection}/{path}"


def read_knowledge_resource(c, collection: str, path: str, node_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """Text and metadata of `knowledge://{collection}/{path}[#{node_id}]`: the whole file without a fragment,
    else the node (its id or its anchor) with its sub-sections."""
    (ix,) = _indexes(c, [collection])
    path = path.lstrip("/")
    nids = ix.documents.get(path)
    if not nids:
        raise DocumentError(f"No document {path!r} in collection {collection!r}",
                            guidance="List the resources (or run `research-agent kb list-documents`).",
                            collection=collection, path=path[:200])
    if node_id:
        node = ix.nodes.get(node_id) if node_id in nids else None
        node = node or next((ix.nodes[n] for n in nids if ix.nodes[n].anchor == node_id), None)
        if node is None:
            raise DocumentError(f"No node {node_id!r} in {path!r}", guidance="Use a node id or anchor of that file.",
                                not_found=[node_id])
        subtree = ix.subtree(node.id)
        chunks = sorted((ch for n in subtree for ch in n.chunks), key=lambda ch: ch[0])
        text = "\n\n".join(t for _, t, _ in chunks)
        meta = {"id": node.id, "collection": collection, "path": node.path, "title": node.title,
                "type": node.eff_type, "status": node.eff_status, "last_checked": node.eff_last_checked,
                "blocked_by": node.blocked_by, "parent_id": node.parent_id, "tokens": _tokens(text)}
        return text, meta
    nodes = [ix.nodes[n] for n in nids]
    chunks = sorted((ch for n in nodes for ch in n.chunks), key=lambda ch: ch[0])
    text = "\n\n".join(t for _, t, _ in chunks)
    return text, _file_metadata(ix, path, nodes) | {"tokens": _tokens(text)}


def _file_metadata(ix: NodeIndex, path: str, nodes: list[Node]) -> dict[str, Any]:
    root = next((n for n in nodes if not n.parent_id or n.parent_id not in ix.nodes), nodes[0])
    return {"id": root.id, "collection": ix.collection, "path": path, "title": root.document_title or root.title,
            "type": root.eff_type, "status": root.eff_status, "last_checked": root.eff_last_checked,
            "node_count": len(nodes), "nodes": [n.id for n in nodes]}


def list_knowledge_resources(c) -> list[dict[str, Any]]:
    """One resource per ingested file: uri knowledge://{collection}/{path}, name, mimeType, metadata."""
    try:
        indexes = _indexes(c, None)
    except CollectionError:
        return []
    out = []
    for ix in indexes:
        for path, nids in ix.documents.items():
            nodes = [ix.nodes[n] for n in nids]
            meta = _file_metadata(ix, path, nodes)
            out.append({"uri": f"knowledge://{ix.collection}/{path}", "name": meta["title"],
                        "mimeType": "text/markdown", "metadata": meta})
    return out


def task_preparation_prompt(task: str) -> str:
    """The protocol's task_preparation prompt, with our tool names."""
    return (
        f"You are about to perform the following task:\n{task}\n\n"
        "Before proceeding, follow these steps:\n\n"
        "1. Call `discover_context` with the task description (and `task_type` and `current_file` when you know "
        "them) to identify relevant knowledge.\n"
        "2. Review the recommendations, their relevance scores and reasons: 0.9 or more must be loaded, 0.7-0.9 "
        "should be loaded, 0.5-0.7 are worth considering.\n"
        "3. Call `retrieve_knowledge` with the ids scoring above 0.7 (pass include_children=true for those "
        "marked include_children); mind their estimated_tokens.\n"
        "4. For a node with prerequisites, call `get_dependencies` and load what it is blocked by.\n"
        "5. Read and internalize the retrieved context.\n"
        "6. Only then proceed with the task, applying the guidelines and patterns you learned.\n\n"
        "If you encounter ambiguity during the task, call `search_knowledge` to find specific guidance."
    )


def knowledge_audit_prompt(task: str, loaded_context: str | list[str]) -> str:
    """The protocol's knowledge_audit prompt: check the loaded context suffices before proceeding."""
    loaded = loaded_context if isinstance(loaded_context, str) else ", ".join(loaded_context)
    return (
        f"You are about to perform the following task:\n{task}\n\n"
        f"You have already loaded these knowledge nodes: {loaded or '(none)'}\n\n"
        "Verify that you have sufficient context before proceeding:\n\n"
        "1. Call `discover_context` with the task description and compare its recommendations with the loaded "
        "nodes: any recommendation scoring 0.7 or more that is not loaded is a gap.\n"
        "2. For each loaded node, call `get_dependencies` (direction upstream) and check that what it is "
        "blocked by is loaded or known to you.\n"
        "3. Call `retrieve_knowledge` for the gaps, or explain why a node is not needed.\n"
        "4. If part of the task is not covered by any knowledge node, say so explicitly and use "
        "`search_knowledge` before making assumptions.\n\n"
        "Report: the loaded nodes that apply, the gaps you filled, and what remains uncovered."
    )


__all__ = [
    "TASK_TYPES", "discover_context", "retrieve_knowledge", "list_knowledge_bases", "search_knowledge",
    "get_dependencies", "read_knowledge_resource", "list_knowledge_resources", "task_preparation_prompt",
    "knowledge_audit_prompt", "DiscoveryResult", "Recommendation", "RetrievalResult", "KnowledgeNode",
    "KnowledgeBaseList", "DependencyGraph", "load_boosts",
]
