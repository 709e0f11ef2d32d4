"""The front matter of a Markdown-JSON hybrid file describes the document's root node (docs/discovery.md, "Nodes").

An outside tester found the usual layout (front matter, then `# Title` at once) lost the front matter's
id/type/status: the root node had no chunk, so `retrieve` did not find it, its children's parent_id dangled,
the type filter left the file out and `dependencies` listed an empty `# Root` as missing.
"""

from __future__ import annotations

import pytest

from research_agent import discovery, ingest
from research_agent.catalog import collections
from research_agent.ingest.chunking import chunk_document
from research_agent.ingest.parsing import parse_text
from research_agent.search import service as query

GUIDE = """---
id: guide-doc
type: guideline
status: active
---
# Coding guide
Some text.
## Section
More.
"""

# The `# Root` section has no text of its own: the front matter's node must still exist.
EMPTY_ROOT = """---
id: root-doc
type: guideline
---
# Root
## Sub
Sub text about widgets.
"""

# Two `#` headings: neither is the document's title, both are children of the front matter's node.
TWO_PARTS = """---
id: parts-doc
title: Parts
type: plan
---
# Part one
First part.
# Part two
Second part.
"""


def _nodes(text: str, source: str = "kb/doc.md") -> dict[str, dict]:
    """node id -> its fields and texts, from a real parse and chunk."""
    out: dict[str, dict] = {}
    for chunk in chunk_document(parse_text(text), source=source):
        entry = out.setdefault(chunk.node.id, {"node": chunk.node, "texts": []})
        entry["texts"].append(chunk.text)
    return out


@pytest.mark.parametrize("text,root", [(GUIDE, "guide-doc"), (EMPTY_ROOT, "root-doc"), (TWO_PARTS, "parts-doc")],
                         ids=["title-h1", "empty-root-h1", "two-h1"])
def test_the_front_matter_node_has_a_chunk_and_no_parent_dangles(text: str, root: str) -> None:
    nodes = _nodes(text)
    assert root in nodes, f"no chunk carries the front matter's id: {list(nodes)}"
    assert nodes[root]["node"].parent_id is None
    for nid, entry in nodes.items():
        parent = entry["node"].parent_id
        assert parent is None or parent in nodes, f"{nid} points at {parent}, which has no chunk"
        assert nid == root or parent is not None  # every other section hangs below the root


def test_the_single_h1_is_the_root_nodes_title_section() -> None:
    nodes = _nodes(GUIDE)
    guide = nodes["guide-doc"]
    assert (guide["node"].type, guide["node"].status) == ("guideline", "active")
    assert guide["texts"] == ["# Coding guide\n\nSome text."]
    (child,) = [e for nid, e in nodes.items() if nid != "guide-doc"]
    assert child["node"].parent_id == "guide-doc" and child["texts"] == ["## Section\n\nMore."]


def test_several_h1_sections_are_children_of_the_front_matter_node() -> None:
    nodes = _nodes(TWO_PARTS)
    parts = [e for nid, e in nodes.items() if nid != "parts-doc"]
    assert [e["texts"] for e in parts] == [["# Part one\n\nFirst part."], ["# Part two\n\nSecond part."]]
    assert all(e["node"].parent_id == "parts-doc" for e in parts)
    assert nodes["parts-doc"]["node"].type == "plan" and nodes["parts-doc"]["texts"] == ["Parts"]


@pytest.fixture
def guides(container, fake_embedder, tmp_path):
    """A real ingest into embedded Chroma of the three layouts (the fake embedder: this is node logic)."""
    folder = tmp_path / "work" / "kb"
    folder.mkdir(parents=True)
    for name, text in (("guide.md", GUIDE), ("root.md", EMPTY_ROOT), ("parts.md", TWO_PARTS)):
        (folder / name).write_text(text)
    collections.create_collection(container, "guides")
    ingest.ingest_path(container, folder, "guides")
    return container


def test_retrieve_filter_and_dependencies_see_the_front_matter_node(guides) -> None:
    got = discovery.retrieve_knowledge(guides, ["guide-doc"], include_children=True)
    (node,) = got.nodes
    assert node.content == "# Coding guide\n\nSome text."
    assert [kid.content for kid in node.children] == ["## Section\n\nMore."]

    by_path = {kb.path: kb for kb in discovery.list_knowledge_bases(guides, filter_type="guideline").knowledge_bases}
    assert set(by_path) == {"kb/guide.md", "kb/root.md"}
    assert (by_path["kb/guide.md"].id, by_path["kb/guide.md"].status) == ("guide-doc", "active")
    assert by_path["kb/root.md"].id == "root-doc" and by_path["kb/root.md"].node_count == 2

    sub = next(n.id for n in by_path["kb/root.md"].nodes if n.id != "root-doc")
    deps = discovery.get_dependencies(guides, sub, direction="upstream")
    assert deps.missing == [] and [n.id for n in deps.nodes] == ["root-doc"]
    assert discovery.get_dependencies(guides, "parts-doc", direction="downstream").missing == []


DUPLICATE = """# Tasks
## Write the spec
- id: spec
- type: task
<!-- content -->
Write it.

## Review the spec
- id: spec
- type: review
<!-- content -->
Review it.
"""


def test_a_second_section_with_the_same_id_is_a_warning_in_the_report(container, fake_embedder, tmp_path) -> None:
    # The second `spec` section was merged into the first silently, its type (review) dropped.
    folder = tmp_path / "work" / "tasks"
    folder.mkdir(parents=True)
    (folder / "dup.md").write_text(DUPLICATE)
    (folder / "fine.md").write_text(GUIDE)
    collections.create_collection(container, "tasks")
    report = ingest.ingest_path(container, folder, "tasks")
    assert (report.added, report.skipped, report.failed) == (2, [], [])
    (warning,) = report.warnings
    assert warning.path == "tasks/dup.md"
    assert "'spec'" in warning.reason and "Review the spec" in warning.reason and "unique" in warning.reason
    got = discovery.retrieve_knowledge(container, ["spec"])  # still ingested, read as one node
    assert "Write it." in got.nodes[0].content and "Review it." in got.nodes[0].content


@pytest.mark.parametrize("text,lines", [
    ("---\ntitle: Only\n---\n", [(1, 3)]),                                        # the title is the only text
    ("---\ntitle: Plan\ndescription: Steps\n---\n# One\n# Two\n", [(1, 6)]),      # headings only: one outline
    (TWO_PARTS, [(1, 5), (6, 7), (8, 9)]),                                         # the root's stub is its title
], ids=["title-only", "title-and-headings", "root-stub"])
def test_text_taken_from_the_front_matter_cites_the_front_matters_lines(text: str, lines: list) -> None:
    chunks = chunk_document(parse_text(text), source="kb/doc.md")
    assert [(c.line_start, c.line_end) for c in chunks] == lines



def test_the_usual_layout_through_the_real_model(container, tmp_path) -> None:
    # The same path with the packaged MiniLM (no fake): ingest, retrieve by the front matter's id, filter by type.
    folder = tmp_path / "work" / "kb"
    folder.mkdir(parents=True)
    (folder / "guide.md").write_text(GUIDE)
    (folder / "only.md").write_text("---\ntitle: Only a title\n---\n")
    collections.create_collection(container, "real")
    report = ingest.ingest_path(container, folder, "real")
    assert (report.added, report.warnings, report.failed) == (2, [], [])
    got = discovery.retrieve_knowledge(container, ["guide-doc"], include_children=True)
    assert got.nodes[0].content == "# Coding guide\n\nSome text." and len(got.nodes[0].children) == 1
    (kb,) = discovery.list_knowledge_bases(container, filter_type="guideline").knowledge_bases
    assert (kb.id, kb.path, kb.node_count) == ("guide-doc", "kb/guide.md", 2)
    hits = query.query_knowledge(container, "only a title", collections=["real"], mode="keyword").results
    assert [(h.source_document, h.metadata.get("line_start"), h.metadata.get("line_end")) for h in hits[:1]] == [
        ("kb/only.md", 1, 3)]
