"""The dependency graph: get_dependencies walks blocked_by and parent/child links between nodes.

An edge `source -> target` means source depends on target: source is blocked_by target, or source
is a child_of target. Upstream follows a node's own blocked_by and parent; downstream follows the
nodes that name it in blocked_by and its children. The walk is breadth first across every searched
collection (the same collection is tried first), never expands a node twice, reports ids that match
no node as `missing` and the blocked_by cycles it met as `cycles`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from research_agent.discovery.models import DIRECTIONS, DependencyEdge, DependencyGraph, DependencyNode
from research_agent.discovery.node_index import Node, NodeIndex, load_indexes, resolve_id
from research_agent.errors import DocumentError, QueryError

if TYPE_CHECKING:
    from research_agent.container import Container

# (neighbour id, edge source, edge target, kind)
_Link = tuple[str, str, str, str]


def _dep_node(ix: NodeIndex, node: Node, distance: int) -> DependencyNode:
    return DependencyNode(id=node.id, collection=ix.collection, path=node.path, title=node.title,
                          type=node.eff_type, status=node.eff_status, distance=distance)


def _check_arguments(direction: str, depth: int, node_id: str) -> None:
    if direction not in DIRECTIONS:
        raise QueryError(f"Unknown direction {direction!r}", guidance=f"Use one of: {', '.join(DIRECTIONS)}.")
    if not isinstance(depth, int) or depth < 1:
        raise QueryError("depth must be 1 or more", guidance="Pass --depth 1 for direct links.")
    if not isinstance(node_id, str) or not node_id.strip():
        raise QueryError("No node id given", guidance="Pass a node id from discover_context or list_knowledge_bases.")


def _find_root(indexes: list[NodeIndex], node_id: str) -> tuple[NodeIndex, Node]:
    found, ambiguity = resolve_id(indexes, node_id.strip())
    if ambiguity:
        raise QueryError(ambiguity, guidance="Qualify the id with its collection.")
    if not found:
        raise DocumentError(f"No node found for: {node_id}", guidance="Use an id from list_knowledge_bases.",
                            not_found=[node_id])
    return found[0]


def get_dependencies(c: Container, node_id: str, *, direction: str = "both", depth: int = 1,
                     collections: list[str] | None = None) -> DependencyGraph:
    """Nodes reached through blocked_by and parent/child links, breadth first, cycle-safe."""
    s = c.settings
    _check_arguments(direction, depth, node_id)
    capped = depth > s.max_dependency_depth
    depth = min(depth, s.max_dependency_depth)
    indexes = load_indexes(c, collections)
    root_ix, root = _find_root(indexes, node_id)
    walk = _Walk(indexes, direction)
    walk.run(root_ix, root, depth)
    return DependencyGraph(node=_dep_node(root_ix, root, 0), direction=direction, depth=depth, depth_capped=capped,
                           nodes=walk.nodes, edges=walk.edges, cycles=_cycles(walk.edges), missing=walk.missing)


class _Walk:
    """One breadth-first walk: the nodes reached (with their distance), the edges and the missing ids."""

    def __init__(self, indexes: list[NodeIndex], direction: str) -> None:
        self.indexes = indexes
        self.direction = direction
        self.nodes: list[DependencyNode] = []
        self.edges: list[DependencyEdge] = []
        self.missing: list[str] = []
        self._seen_edges: set[tuple[str, str, str]] = set()
        self._visited: set[tuple[str, str]] = set()

    def run(self, root_ix: NodeIndex, root: Node, depth: int) -> None:
        self._visited.add((root_ix.collection, root.id))
        frontier = [(root_ix, root)]
        for distance in range(1, depth + 1):
            nxt = []
            for ix, node in frontier:
                for link in self._neighbours(node):
                    hit = self._follow(ix, link)
                    if hit is not None and self._visit(hit, distance):
                        nxt.append(hit)
            frontier = nxt

    def _follow(self, ix: NodeIndex, link: _Link) -> tuple[NodeIndex, Node] | None:
        """The node a link leads to (recording the edge), or None when its id matches no node."""
        nid, src, dst, kind = link
        hit = self._lookup(ix, nid)
        if hit is None:
            if nid not in self.missing:
                self.missing.append(nid)
            return None
        if (src, dst, kind) not in self._seen_edges:
            self._seen_edges.add((src, dst, kind))
            self.edges.append(DependencyEdge(source=src, target=dst, kind=kind))
        return hit

    def _visit(self, hit: tuple[NodeIndex, Node], distance: int) -> bool:
        # A node already reached (a cycle, or two paths) is not expanded again.
        key = (hit[0].collection, hit[1].id)
        if key in self._visited:
            return False
        self._visited.add(key)
        self.nodes.append(_dep_node(hit[0], hit[1], distance))
        return True

    def _lookup(self, ix: NodeIndex, nid: str) -> tuple[NodeIndex, Node] | None:
        if nid in ix.nodes:  # the same collection first, then the others
            return ix, ix.nodes[nid]
        for other in self.indexes:
            if nid in other.nodes:
                return other, other.nodes[nid]
        return None

    def _neighbours(self, node: Node) -> list[_Link]:
        out: list[_Link] = []
        if self.direction in ("upstream", "both"):
            out += [(dep, node.id, dep, "blocked_by") for dep in node.blocked_by]
            if node.parent_id:
                out.append((node.parent_id, node.id, node.parent_id, "child_of"))
        if self.direction in ("downstream", "both"):
            for other in self.indexes:
                out += [(dep, dep, node.id, "blocked_by") for dep in other.blocks.get(node.id, [])]
            out += [(kid, kid, node.id, "child_of") for kid in node.children]
        return out


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
