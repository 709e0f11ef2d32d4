"""The node index: one per collection, built from its chunks, cached until the collection's revision moves.

Chunks are the unit of retrieval, nodes the unit of recommendation. The index groups a collection's
current chunks (the ones whose document manifest points at their content hash) into nodes in
document order, links parents to children and blockers to what they block, inherits type, status
and last_checked down the tree, and keeps every chunk's embedding in one L2-normalised matrix so
that dense candidates are one matrix product (5,000 nodes: a few ms) instead of a Chroma query.

The cache is keyed by (store location, Chroma collection id) and checked against the store's
revision counter, so any process's write rebuilds it on the next call. It is the same revision cache as the
keyword index's (research_agent/storage/revision_cache.py), with its per-collection build lock: two
concurrent first calls (MCP worker threads) build once, not twice.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import date
from typing import TYPE_CHECKING, Any

from research_agent.discovery.analysis import (
    count_tokens,
    defined_identifiers,
    first_sentence,
    identifiers,
    parse_date,
    terms,
)
from research_agent.discovery.direction import Sides, tool_sides
from research_agent.storage.chunks import visible_chunks
from research_agent.storage.revision_cache import RevisionCache

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)


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
    idents: frozenset[str] = frozenset()  # code-like words, lowercased (analysis.identifiers)
    defines: frozenset[str] = frozenset()  # those of idents the node defines (analysis.defined_identifiers)
    sides: Sides | None = None  # a tool section's (input, output) stems (direction.tool_sides); None elsewhere
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
    ident_nodes: dict[str, list[str]] = field(default_factory=dict)  # identifier -> ids of the nodes holding it
    ident_defs: dict[str, list[str]] = field(default_factory=dict)  # identifier -> ids of the nodes defining it

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


#: The fields a node inherits from its nearest ancestor (Node.eff_*): type, status and last_checked.
INHERITED: tuple[str, ...] = tuple(f.name.removeprefix("eff_") for f in fields(Node) if f.name.startswith("eff_"))


def schema_fields(node: Node, *, effective: bool = False, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The node's schema fields (ingest/nodes.py NodeFields but its id) under their field names: the wire
    metadata of retrieve_knowledge and of the knowledge:// resources, built here once (issue 13 found the six
    spelled out in both). effective: the INHERITED three as inherited; only: just these fields."""
    from research_agent.ingest.nodes import STORED_KEYS

    names = [name for name in STORED_KEYS if name != "id" and (only is None or name in only)]
    return {name: getattr(node, f"eff_{name}" if effective and name in INHERITED else name) for name in names}


#: (store location, Chroma collection id) -> the node index, stamped with the collection's revision.
_cache: RevisionCache[NodeIndex] = RevisionCache()

# (document rank, chunk sequence, source document, text, metadata, embedding)
_Row = tuple[int, int, str, str, dict[str, Any], Any]


def _current_rows(c: Container, collection: str, col: Any) -> list[_Row]:
    """Every chunk whose document manifest points at its version, in document then chunk order."""
    found = list(visible_chunks(c.store, collection, col, embeddings=True))
    rank = {d: i for i, d in enumerate(sorted({meta.get("source_document") for _, _, meta, _ in found}))}
    rows: list[_Row] = [(rank[meta.get("source_document")], int(meta.get("chunk_sequence_id", 0)),
                         meta.get("source_document"), doc, meta, vector) for _, doc, meta, vector in found]
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows


def _new_node(collection: str, nid: str, source: str, meta: dict[str, Any]) -> Node:
    """A node from its first chunk's metadata, its fields read by the one node schema (ingest/nodes.py)."""
    from research_agent.ingest.nodes import from_metadata  # lazily: see _group

    nf = from_metadata(meta)
    return Node(
        collection=collection, id=nid, source_document=source,
        document_title=meta.get("document_title", ""), header_path=meta.get("header_path", ""),
        anchor=meta.get("anchor", ""), type=nf.type, status=nf.status, parent_id=nf.parent_id,
        blocked_by=nf.blocked_by, last_checked=nf.last_checked, labels=nf.labels,
        description=nf.extra.get("description") or (meta.get("description", "") if not meta.get("header_path") else ""),
        explicit_title=nf.extra.get("title"),
    )


def _group(collection: str, rows: list[_Row]) -> tuple[dict[str, Node], list[str], dict[str, list[str]]]:
    """Chunks grouped into nodes: (nodes, ids in document order, source document -> ids).

    The node schema is imported here, not at the top: the ingest package's __init__ pulls in the store and
    its locks (~0.1 s), which importing discovery (the MCP server's start-up) does not need yet."""
    from research_agent.ingest.nodes import STORED_KEYS

    nodes: dict[str, Node] = {}
    order: list[str] = []
    documents: dict[str, list[str]] = {}
    for row_no, (_, seq, source, text, meta, _vec) in enumerate(rows):
        nid = meta.get(STORED_KEYS["id"]) or f"{source}#{meta.get('anchor', '')}"
        node = nodes.get(nid)
        if node is None:
            node = nodes[nid] = _new_node(collection, nid, source, meta)
            order.append(nid)
            documents.setdefault(source, []).append(nid)
        elif node.source_document != source:
            # The same explicit id in two files: the first file keeps it (ids must be unique).
            log.warning("node id %r appears in %s and %s; keeping the first", nid, node.source_document, source)
            continue
        node.chunks.append((seq, text, meta))
        node.rows.append(row_no)
    return nodes, order, documents


def _unit_matrix(rows: list[_Row]) -> Any:
    import numpy as np

    vectors = [row[5] for row in rows]
    matrix = np.asarray(vectors, dtype="float32") if vectors else np.zeros((0, 1), dtype="float32")
    if len(matrix):
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True).clip(min=1e-12)
    return matrix


def _link_and_analyse(nodes: dict[str, Node], order: list[str]) -> tuple[Counter, dict[str, list[str]], date | None]:
    """Children, blockers, descriptions, tokens and terms of every node: (df, blocks, newest last_checked)."""
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
            node.description = first_sentence(text)
        node.own_tokens = count_tokens(text)
        title_text = " ".join([node.header_path or node.document_title, " ".join(node.labels)])
        node.title_terms = frozenset(terms(title_text))
        node.terms = frozenset(terms(text)) | node.title_terms | frozenset(terms(node.document_title))
        node.idents = frozenset(identifiers(" ".join((text, node.header_path, node.document_title))))
        node.defines = frozenset(defined_identifiers(text)) & node.idents
        node.sides = tool_sides(node.title, text)
        df.update(node.terms)
        checked = parse_date(node.last_checked)
        if checked and (newest is None or checked > newest):
            newest = checked
    return df, blocks, newest


def _inherit(nodes: dict[str, Node], order: list[str]) -> None:
    """Type, status and last_checked from the nearest ancestor that has them."""
    for nid in order:
        node = nodes[nid]
        chain = ancestors(nodes, node)
        node.eff_type = next((n.type for n in chain if n.type), None)
        node.eff_status = next((n.status for n in chain if n.status), None)
        node.eff_last_checked = next((n.last_checked for n in chain if n.last_checked), None)


def _build_index(c: Container, collection: str, col: Any) -> NodeIndex:
    rows = _current_rows(c, collection, col)
    nodes, order, documents = _group(collection, rows)
    matrix = _unit_matrix(rows)
    df, blocks, newest = _link_and_analyse(nodes, order)
    _inherit(nodes, order)
    row_nodes = [""] * len(rows)
    for nid in order:
        for r in nodes[nid].rows:
            row_nodes[r] = nid
    return NodeIndex(collection, nodes, order, matrix, df, blocks, documents, newest, row_nodes,
                     _ident_postings(nodes, order, "idents"), _ident_postings(nodes, order, "defines"))


def _ident_postings(nodes: dict[str, Node], order: list[str], attr: str) -> dict[str, list[str]]:
    """Identifier -> the nodes holding (attr "idents") or defining ("defines") it, in document order."""
    postings: dict[str, list[str]] = {}
    for nid in order:
        for ident in getattr(nodes[nid], attr):
            postings.setdefault(ident, []).append(nid)
    return postings


def ancestors(nodes: dict[str, Node], node: Node) -> list[Node]:
    """The node, its parent, its parent's parent ... (cycle-safe)."""
    chain, seen = [], set()
    while node is not None and node.id not in seen:
        chain.append(node)
        seen.add(node.id)
        node = nodes.get(node.parent_id) if node.parent_id else None
    return chain


def node_index(c: Container, collection: str) -> NodeIndex:
    """The cached node index of a collection; rebuilt when its revision moved (any process's write)."""
    from research_agent.catalog.collections import open_collection

    col = open_collection(c, collection, check_model=False)
    key = (c.store.location, str(col.id))
    return _cache.get_or_build(key, c.store.revision(collection), lambda: _build_index(c, collection, col))


def load_indexes(c: Container, collections: list[str] | None, project: str | None = None) -> list[NodeIndex]:
    """The node indexes of the named collections (all of them, or a project's, when none are named)."""
    from research_agent.search.service import resolve_collections

    c.store.refresh()
    return [node_index(c, name) for name in resolve_collections(c, collections, project)]


def resolve_id(indexes: list[NodeIndex], ident: str) -> tuple[list[tuple[NodeIndex, Node]], str | None]:
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


def unit(vec: Any) -> Any:
    """`vec` as a float32 unit vector (a zero vector stays zero)."""
    import numpy as np

    q = np.asarray(vec, dtype="float32")
    return q / max(float(np.linalg.norm(q)), 1e-12)
