"""Discovery's MCP face: the knowledge:// resources and the protocol's two prompt texts.

These serve only the MCP server (resources/list, resources/read, prompts/get); the CLI has no use
for them. They live here, apart from the service functions, so the MCP split (issue 13:
research_agent/mcp/resources.py and prompts.py) can take them whole; the node index they read
stays in node_index.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pydantic import BaseModel

from research_agent.catalog.common import paginate
from research_agent.discovery.analysis import count_tokens
from research_agent.discovery.node_index import INHERITED, Node, NodeIndex, load_indexes, schema_fields
from research_agent.errors import CollectionError, DocumentError

if TYPE_CHECKING:
    from research_agent.container import Container

RESOURCE_TEMPLATE = "knowledge://{collection}/{path}"


def read_knowledge_resource(c: Container, collection: str, path: str,
                            node_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """Text and metadata of `knowledge://{collection}/{path}[#{node_id}]`: the whole file without a fragment,
    else the node (its id or its anchor) with its sub-sections."""
    (ix,) = load_indexes(c, [collection])
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
                **schema_fields(node, effective=True), "tokens": count_tokens(text)}
        return text, meta
    nodes = [ix.nodes[n] for n in nids]
    chunks = sorted((ch for n in nodes for ch in n.chunks), key=lambda ch: ch[0])
    text = "\n\n".join(t for _, t, _ in chunks)
    return text, _file_metadata(ix, path, nodes) | {"tokens": count_tokens(text)}


def _file_metadata(ix: NodeIndex, path: str, nodes: list[Node]) -> dict[str, Any]:
    root = next((n for n in nodes if not n.parent_id or n.parent_id not in ix.nodes), nodes[0])
    return {"id": root.id, "collection": ix.collection, "path": path, "title": root.document_title or root.title,
            **schema_fields(root, effective=True, only=INHERITED), "node_count": len(nodes),
            "nodes": [n.id for n in nodes]}


class KnowledgeResource(BaseModel):
    """One entry of research://knowledge (a page holds these; see list_knowledge_resources)."""

    uri: str
    name: str
    mimeType: str = "text/markdown"  # noqa: N815 - MCP's own field name
    metadata: dict[str, Any]


def list_knowledge_resources(c: Container, *, limit: int | None = None,
                             cursor: str | None = None) -> dict[str, Any]:
    """One page of resources, one per ingested file: uri knowledge://{collection}/{path}, name, mimeType,
    metadata; with `total` and `next_cursor` (catalog/common.py's paging rule: 100 items or 24 KB).

    Why paged: each entry lists its node ids, so a 334-file store answered this read with about 700 KB,
    more than an agent's context can take (issue 15); every other list already pages."""
    try:
        indexes = load_indexes(c, None)
    except CollectionError:
        indexes = []
    files = [(ix, path, nids) for ix in indexes for path, nids in ix.documents.items()]

    def view(item: tuple[NodeIndex, str, list[str]]) -> KnowledgeResource:
        ix, path, nids = item
        meta = _file_metadata(ix, path, [ix.nodes[n] for n in nids])
        # Percent-escaped: a records key (`tools.jsonl#t1`) or a `?` in a file name made the listed uri unreadable
        # (`#` starts a fragment; outside tester). Template matching decodes it back.
        return KnowledgeResource(uri=f"knowledge://{ix.collection}/{quote(path, safe='/')}", name=meta["title"],
                                 metadata=meta)

    shown, page = paginate(files, lambda f: f"{f[0].collection}\n{f[1]}", "knowledge", view,
                           limit=limit, cursor=cursor)
    return {"resources": [r.model_dump() for r in shown], **page.model_dump()}


def task_preparation_prompt(task: str) -> str:
    """The protocol's task_preparation prompt, with our tool names."""
    return (
        f"You are about to perform the following task:\n{task}\n\n"
        "Before proceeding, follow these steps:\n\n"
        "1. Call `discover_context` with the task description (and `task_type` and `current_file` when you know "
        "them) to identify relevant knowledge.\n"
        "2. Review the recommendations, their relevance scores and reasons: 0.9 or more must be loaded, 0.7-0.9 "
        "should be loaded, 0.5-0.7 are worth considering; below 0.5 (priority skip) are alternatives only.\n"
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
