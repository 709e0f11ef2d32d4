"""Discovery: "what do I need to know to do X?" over knowledge nodes (the Meta MCP Agent protocol).

A *node* is a section of an ingested document with its own id (the Markdown-JSON hybrid format's
`- id:` bullet, or the id the chunker derives from the header path). Chunks are the unit of
retrieval; nodes are the unit of recommendation: discovery aggregates chunks to nodes, scores each
node, and recommends ids that `retrieve_knowledge` returns reassembled in document order.

This module holds the service functions the CLI (research_agent/cli/discover.py) and the MCP tools
call: it checks arguments, times the stages and assembles the wire results. The work is done in
node_index.py (nodes and their cache), ranking.py (the scoring model) and boosts.py; the graph walk
is graph.py's get_dependencies, the MCP resources and prompts are in mcp_face.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from research_agent.discovery import ranking
from research_agent.discovery.analysis import count_tokens, parse_date, to_plain
from research_agent.discovery.models import (
    FORMATS,
    SEARCH_TYPES,
    TASK_TYPES,
    DiscoveryResult,
    KnowledgeBase,
    KnowledgeBaseList,
    KnowledgeNode,
    NodeSummary,
    RetrievalResult,
    Section,
)
from research_agent.discovery.node_index import (
    Node,
    NodeIndex,
    load_indexes,
    node_index,
    resolve_id,
    schema_fields,
    unit,
)
from research_agent.errors import CollectionError, DocumentError, QueryError
from research_agent.storage.registry import project_key
from research_agent.text import checked_text

if TYPE_CHECKING:
    from research_agent.container import Container


# -- discover_context --------------------------------------------------------------------------------------
def _validate_task(task: Any, settings: Any) -> str:
    return checked_text(task, settings.max_query_chars, name="task description",
                        empty="Describe the task you are about to do.",
                        too_long="Summarise the task in a few sentences.")


def _validate_task_type(task_type: str | None) -> str | None:
    if task_type is None or task_type == "":
        return None
    if task_type not in TASK_TYPES:
        raise QueryError(f"Unknown task_type {task_type!r}", guidance=f"Use one of: {', '.join(TASK_TYPES)}.",
                         allowed=list(TASK_TYPES))
    return task_type


def discover_context(c: Container, task_description: str, *, task_type: str | None = None,
                     current_file: str | None = None, max_results: int = 5, collections: list[str] | None = None,
                     project: str | None = None) -> DiscoveryResult:
    """A ranked, explained reading list of knowledge nodes for a task.

    Scores are calibrated probabilities (ranking.py, scoring.py). Nodes scoring discovery_min_score (0.5)
    or more are the recommendations (total_available counts them); the list is filled up to max_results
    with the next best down to ranking.LIST_FLOOR, marked priority "skip". Nothing at 0.5 or more is the
    abstention, and the message says so.
    """
    from research_agent.search.service import resolve_collections

    s = c.settings
    t0 = time.perf_counter()
    task = _validate_task(task_description, s)
    task_type = _validate_task_type(task_type)
    if not isinstance(max_results, int) or not 1 <= max_results <= s.max_top_k:
        raise QueryError(f"max_results must be between 1 and {s.max_top_k}",
                         guidance=f"Pass a --max-results from 1 to {s.max_top_k}.")
    c.store.refresh()
    names = resolve_collections(c, collections, project)
    timings: dict[str, float] = {}
    indexes = [node_index(c, name) for name in names]
    timings["index"] = (time.perf_counter() - t0) * 1000
    t = time.perf_counter()
    qvec = unit(c.embedder.embed_query(task))
    timings["embed"] = (time.perf_counter() - t) * 1000
    nominated = ranking.candidates(c, task, indexes, qvec, s.discovery_candidates, timings)
    t = time.perf_counter()
    scored = ranking.score_nodes(c, task, indexes, nominated, qvec, task_type, current_file)
    min_score = s.discovery_min_score
    scored, listed = ranking.rank(scored, min_score, s.discovery_collapse_max_tokens)
    recs = ranking.recommendations(listed, indexes, max_results)
    timings["score"] = (time.perf_counter() - t) * 1000
    timings["total"] = (time.perf_counter() - t0) * 1000
    said = ranking.message(recs, scored, min_score) if any(ix.nodes for ix in indexes) else \
        ranking.empty_message(names)
    return DiscoveryResult(recommendations=recs, total_available=sum(1 for x in listed if x.score >= min_score),
                           message=said, task_type=task_type, collections=names,
                           timings_ms={k: round(v, 1) for k, v in timings.items()})


# -- retrieve_knowledge --------------------------------------------------------------------------------
def _metadata(node: Node) -> dict[str, Any]:
    return {**schema_fields(node), "header_path": node.header_path, "source_document": node.source_document,
            "document_title": node.document_title, "anchor": node.anchor, "description": node.description,
            "children": list(node.children), "effective_type": node.eff_type, "effective_status": node.eff_status}


def _render(index: NodeIndex, node: Node, fmt: str, include_children: bool) -> KnowledgeNode:
    markdown = node.markdown()
    sections = None
    if fmt == "json":
        sections = [Section(header_path=m.get("header_path", ""), content_type=m.get("content_type", "prose"),
                            code_language=m.get("code_language"), text=text) for _, text, m in node.chunks]
        content = ""
        tokens = sum(count_tokens(s.text) for s in sections)
    elif fmt == "plain":
        content = to_plain(markdown)
        tokens = count_tokens(content)
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


def _checked_ids(ids: Any, settings: Any, format: str) -> list[str]:
    """The distinct non-empty ids, after checking their number and the format."""
    if isinstance(ids, str):
        ids = [ids]
    ids = list(dict.fromkeys(i.strip() for i in (ids or []) if isinstance(i, str) and i.strip()))
    if not ids:
        raise QueryError("No ids given", guidance="Pass the ids that discover_context recommended.")
    if len(ids) > settings.max_retrieve_ids:
        raise QueryError(f"{len(ids)} ids requested; at most {settings.max_retrieve_ids} per call",
                         guidance="Split the ids over several calls or raise RESEARCH_AGENT_MAX_RETRIEVE_IDS.",
                         limit=settings.max_retrieve_ids)
    if format not in FORMATS:
        raise QueryError(f"Unknown format {format!r}", guidance=f"Use one of: {', '.join(FORMATS)}.")
    return ids


def retrieve_knowledge(c: Container, ids: list[str], *, include_children: bool = False, format: str = "markdown",
                       collections: list[str] | None = None) -> RetrievalResult:
    """Full content of nodes, reassembled from their chunks in document order.

    Unknown ids do not cost the caller the ones that exist: found nodes are returned with the rest
    listed in `not_found`; only when no id is found at all is it a DocumentError (listing them).
    """
    ids = _checked_ids(ids, c.settings, format)
    indexes = load_indexes(c, collections)
    nodes: list[KnowledgeNode] = []
    not_found: list[str] = []
    problems: list[str] = []
    for ident in ids:
        found, ambiguity = resolve_id(indexes, ident)
        if ambiguity:
            problems.append(ambiguity)
            not_found.append(ident)
        elif not found:
            not_found.append(ident)
        else:
            ix, node = found[0]
            nodes.append(_render(ix, node, format, include_children))
    why = f" ({'; '.join(problems)})" if problems else ""
    if not nodes:
        raise DocumentError(f"No node found for: {', '.join(not_found)}",
                            guidance="Use ids from discover_context or list_knowledge_bases" + why + ".",
                            not_found=not_found)
    message = f"Not found: {', '.join(not_found)}{why}" if not_found else ""
    return RetrievalResult(nodes=nodes, total_tokens=_total_tokens(nodes), format=format, not_found=not_found,
                           message=message)


# -- list_knowledge_bases ------------------------------------------------------------------------------
def _knowledge_base(ix: NodeIndex, source: str, all_nodes: list[Node], nodes: list[Node]) -> KnowledgeBase:
    root = next((n for n in all_nodes if not n.parent_id or n.parent_id not in ix.nodes), all_nodes[0])
    dates = [d for d in (n.last_checked for n in all_nodes) if parse_date(d)]
    return KnowledgeBase(
        id=root.id, collection=ix.collection, path=source, title=root.document_title or root.title,
        type=root.eff_type, status=root.eff_status, description=root.description,
        last_checked=max(dates, key=lambda d: parse_date(d)) if dates else None, node_count=len(nodes),
        nodes=[NodeSummary(id=n.id, path=n.path, title=n.title, type=n.eff_type, status=n.eff_status,
                           last_checked=n.eff_last_checked) for n in nodes],
    )


#: (index, file, all its nodes, the nodes the filters keep): a catalogue entry before it is viewed.
_Match = tuple[NodeIndex, str, list[Node], list[Node]]


def _matches(indexes: list[NodeIndex], filter_type: str | None, filter_status: str | None) -> list[_Match]:
    """Every file with a node the filters keep (a node's own or inherited type/status, case-insensitive)."""
    out: list[_Match] = []
    for ix in indexes:
        for source, nids in ix.documents.items():
            all_nodes = [ix.nodes[n] for n in nids]
            nodes = [n for n in all_nodes
                     if (not filter_type or (n.eff_type or "").lower() == filter_type.lower())
                     and (not filter_status or (n.eff_status or "").lower() == filter_status.lower())]
            if nodes:
                out.append((ix, source, all_nodes, nodes))
    return out


def list_knowledge_bases(c: Container, *, filter_type: str | None = None, filter_status: str | None = None,
                         collections: list[str] | None = None, limit: int | None = None,
                         cursor: str | None = None) -> KnowledgeBaseList:
    """One page of the catalogue of ingested files with their nodes, in collection/path order, paged by the
    catalog's one paging rule (catalog/common.py `paginate`: DEFAULT_PAGE files or 24 KB by default); the
    totals count every match. Unpaged, one call returned 719 KB on a 334-file store (issue 15)."""
    from research_agent.catalog.common import paginate

    try:
        indexes = load_indexes(c, collections)
    except CollectionError:
        if collections:
            raise
        indexes = []
    matches = _matches(indexes, filter_type, filter_status)
    shown, page = paginate(matches, lambda m: f"{m[0].collection}/{m[1]}", "knowledge_bases",
                           lambda m: _knowledge_base(*m), limit=limit, cursor=cursor)
    return KnowledgeBaseList(knowledge_bases=shown, total_files=page.total,
                             total_nodes=sum(len(m[3]) for m in matches), next_cursor=page.next_cursor)


# -- search_knowledge ---------------------------------------------------------------------------------
def search_knowledge(c: Container, query: str, *, search_type: str = "hybrid", scope: str | list[str] | None = None,
                     max_results: int = 10):
    """query.query_knowledge scoped to knowledge collections: `scope` is collection names or a project name."""
    from research_agent.search.service import query_knowledge

    if search_type not in SEARCH_TYPES:
        raise QueryError(f"Unknown search_type {search_type!r}", guidance=f"Use one of: {', '.join(SEARCH_TYPES)}.")
    collections, project = None, None
    if isinstance(scope, str):
        scope = [p.strip() for p in scope.split(",") if p.strip()]
    if scope:
        if len(scope) == 1 and not c.store.has_collection(scope[0]) \
                and c.store.registry_get([project_key(scope[0])]):
            project = scope[0]
        else:
            collections = scope
    return query_knowledge(c, query, collections=collections, project=project, top_k=max_results, mode=search_type)
