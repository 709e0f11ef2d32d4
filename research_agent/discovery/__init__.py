"""Discovery: "what do I need to know to do X?" over knowledge nodes (the Meta MCP Agent protocol).

The package's public names, re-exported so callers import `research_agent.discovery` and never a
submodule. Where things live:

- models.py      the wire shapes (Recommendation, DiscoveryResult, ...) and argument vocabularies
- analysis.py    first sentences, dates, token counts, plain text (content words: research_agent.text)
- node_index.py  nodes built from a collection's chunks, cached per collection revision
- boosts.py      task_boosts.yaml (shipped here) merged with the user's file; the boost factors
- scoring.py     the fitted probability model (features, coefficients) behind relevance_score
- ranking.py     candidates, their evidence and score, prefer-the-parent, listing, reasons and the message
- graph.py       get_dependencies: the blocked_by / parent-child walk
- service.py     discover_context, retrieve_knowledge, list_knowledge_bases, search_knowledge
- mcp_face.py    knowledge:// resources and the protocol's prompt texts (MCP only)
"""

from research_agent.discovery.analysis import terms, to_plain
from research_agent.discovery.boosts import BOOSTS_FILE, load_boosts
from research_agent.discovery.graph import get_dependencies
from research_agent.discovery.mcp_face import (
    RESOURCE_TEMPLATE,
    knowledge_audit_prompt,
    list_knowledge_resources,
    read_knowledge_resource,
    task_preparation_prompt,
)
from research_agent.discovery.models import (
    DIRECTIONS,
    FORMATS,
    SEARCH_TYPES,
    TASK_TYPES,
    DependencyEdge,
    DependencyGraph,
    DependencyNode,
    DiscoveryResult,
    KnowledgeBase,
    KnowledgeBaseList,
    KnowledgeNode,
    NodeSummary,
    Recommendation,
    RetrievalResult,
    Section,
)
from research_agent.discovery.node_index import Node, NodeIndex, node_index
from research_agent.discovery.ranking import CONSIDER, MUST_LOAD, SHOULD_LOAD, priority
from research_agent.discovery.service import (
    discover_context,
    list_knowledge_bases,
    retrieve_knowledge,
    search_knowledge,
)

__all__ = [
    "TASK_TYPES", "discover_context", "retrieve_knowledge", "list_knowledge_bases", "search_knowledge",
    "get_dependencies", "read_knowledge_resource", "list_knowledge_resources", "task_preparation_prompt",
    "knowledge_audit_prompt", "DiscoveryResult", "Recommendation", "RetrievalResult", "KnowledgeNode",
    "KnowledgeBaseList", "DependencyGraph", "load_boosts",
    # also public before the split (module-level names callers could reach)
    "terms", "to_plain", "BOOSTS_FILE", "RESOURCE_TEMPLATE", "DIRECTIONS", "FORMATS", "SEARCH_TYPES",
    "DependencyEdge", "DependencyNode", "KnowledgeBase", "NodeSummary", "Section", "Node", "NodeIndex",
    "node_index", "CONSIDER", "MUST_LOAD", "SHOULD_LOAD", "priority",
]
