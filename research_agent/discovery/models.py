"""Discovery's wire shapes: what the service functions return (`.model_dump(mode="json")` is what the
CLI's --json and the MCP tools send), and the vocabularies their arguments are checked against.

Kept apart from the logic so the faces (CLI, MCP) and the schema snapshot can import the shapes
without the ranking code, and so a change to a wire field shows up in one small file.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

TASK_TYPES = ("implement", "debug", "refactor", "document", "review", "design", "test")
FORMATS = ("markdown", "json", "plain")
DIRECTIONS = ("upstream", "downstream", "both")
SEARCH_TYPES = ("hybrid", "semantic", "keyword")


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
    """One page of the catalogue (catalog/common.py `paginate`): total_files is the page's `total`, and like
    total_nodes counts every match; next_cursor fetches the next page (None on the last)."""

    knowledge_bases: list[KnowledgeBase]
    total_files: int
    total_nodes: int
    next_cursor: str | None = None


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
