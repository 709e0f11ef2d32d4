"""Discovery: the golden set on the real packaged model, and each service function on small knowledge bases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from conftest import make_node
from research_agent import discovery, ingest
from research_agent.catalog import collections
from research_agent.discovery import ranking
from research_agent.errors import CollectionError, ConfigError, DocumentError, QueryError

KNOWLEDGE = Path(__file__).parent / "fixtures" / "knowledge"
GOLDEN = yaml.safe_load((KNOWLEDGE / "golden.yaml").read_text(encoding="utf-8"))["tasks"]

# hit@3 threshold. Measured 1.00 (18 tasks with expected nodes) when this was written; 0.85 lets two
# tasks slip (float differences across CPUs/BLAS move near-ties) but not a broken stage: ignoring the
# boosts or the keyword evidence, or recommending chunks instead of nodes, each cost more than that.
HIT_AT_3 = 0.85
MRR = 0.80


# -- the golden set, real model, one knowledge base for the module -----------------------------------
@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """The golden knowledge base ingested once with the real packaged embedding model."""
    from research_agent.container import build_container

    root = tmp_path_factory.mktemp("golden")
    with pytest.MonkeyPatch.context() as mp:  # the autouse isolated_env is per test; do the same here
        for key in list(os.environ):
            if key.startswith("RESEARCH_AGENT_"):
                mp.delenv(key)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        mp.setenv("XDG_DATA_HOME", str(root / "data"))
        mp.chdir(root)
        c = build_container(store=str(root / "store"))
        collections.create_collection(c, "knowledge", type="fundamental")
        report = ingest.ingest_path(c, KNOWLEDGE, "knowledge", recursive=True, include=["*.md"])
        assert report.added == 9 and not report.skipped and not report.failed
    yield c
    c.close()


def _rank(recs, expected) -> int | None:
    return next((i for i, r in enumerate(recs, start=1) if r.id in expected), None)


def test_golden_set_hit_rate_and_no_knowledge_cases(kb):
    ranks, empty = [], []
    for case in GOLDEN:
        res = discovery.discover_context(kb, case["task"], task_type=case["task_type"], max_results=5)
        scores = [r.relevance_score for r in res.recommendations]
        assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
        assert all((r.priority == "skip") == (r.relevance_score < 0.5) for r in res.recommendations)
        assert len({r.id for r in res.recommendations}) == len(res.recommendations)
        if case["expected"]:
            ranks.append(_rank(res.recommendations, set(case["expected"])))
        else:
            empty.append((case["task"], res))
    n = len(ranks)
    hit1 = sum(r == 1 for r in ranks) / n
    hit3 = sum(r is not None and r <= 3 for r in ranks) / n
    mrr = sum(1 / r for r in ranks if r) / n
    print(f"\ngolden set: n={n} hit@1={hit1:.3f} hit@3={hit3:.3f} MRR={mrr:.3f}")
    assert n >= 14 and len(empty) >= 2
    assert hit3 >= HIT_AT_3 and mrr >= MRR
    for task, res in empty:  # nothing relevant: no recommendation >= 0.5, and a message that says so
        assert all(r.relevance_score < 0.5 for r in res.recommendations) and res.total_available == 0, task
        assert "No knowledge relevant" in res.message


def test_golden_covers_all_task_types():
    assert {case["task_type"] for case in GOLDEN} == set(discovery.TASK_TYPES)


def test_recommendation_shape_reason_and_tokens(kb):
    res = discovery.discover_context(kb, "Add cursor-based pagination to the endpoint that lists orders",
                                     task_type="implement")
    top = res.recommendations[0]
    assert top.id == "guidelines.api.pagination" and top.relevance_score >= 0.9 and top.priority == "must_load"
    assert top.path == "knowledge/guidelines/api_design.md#pagination"
    assert (top.title, top.type, top.collection) == ("Pagination", "guideline", "knowledge")
    # The reason is built from what matched, not a fixed string.
    assert "'pagination'" in top.reason and "guideline x1.5 for implement" in top.reason
    assert "HTTP API Design Guidelines > Pagination" in top.reason
    # estimated_tokens is exactly what retrieve_knowledge returns for the id.
    got = discovery.retrieve_knowledge(kb, [top.id])
    assert got.total_tokens == top.estimated_tokens > 0
    wire = res.model_dump(mode="json")
    assert set(wire) >= {"recommendations", "total_available", "message"}
    assert set(wire["recommendations"][0]) >= {"id", "path", "title", "type", "relevance_score", "reason",
                                                "estimated_tokens"}


def test_parent_preferred_when_several_children_match(kb):
    res = discovery.discover_context(kb, "Error handling and logging conventions in Python")
    ids = [r.id for r in res.recommendations]
    assert ids[0] == "guidelines.python"
    top = res.recommendations[0]
    assert top.include_children and "2 matching sections" in top.reason
    # Its children are not recommended again, and the tokens count the whole subtree.
    assert "guidelines.python.errors" not in ids and "guidelines.python.logging" not in ids
    full = discovery.retrieve_knowledge(kb, ["guidelines.python"], include_children=True)
    assert full.total_tokens == top.estimated_tokens


def test_status_and_proximity_move_scores(kb):
    res = discovery.discover_context(kb, "Decide how clients will select the API version", task_type="design")
    ids = [r.id for r in res.recommendations]
    assert ids.index("guidelines.api.versioning") < ids.index("guidelines.api.url_versioning")
    score = {r.id: r.relevance_score for r in res.recommendations}
    deprecated = next(r for r in res.recommendations if r.id == "guidelines.api.url_versioning")
    assert "status deprecated" in deprecated.reason
    assert deprecated.relevance_score < score["guidelines.api.versioning"] - 0.1
    task = "Fix the pagination of the orders endpoint"
    plain = discovery.discover_context(kb, task, task_type="debug")
    near = discovery.discover_context(kb, task, task_type="debug", current_file="knowledge/guidelines/api_design.md")
    score = {r.id: r.relevance_score for r in plain.recommendations}["guidelines.api.pagination"]
    top = near.recommendations[0]
    assert top.id == "guidelines.api.pagination" and top.relevance_score > score
    assert "same file as current_file" in top.reason


def test_vague_task_is_not_padded_with_random_nodes(kb):
    res = discovery.discover_context(kb, "Add an endpoint", task_type="implement")
    assert all(r.relevance_score < 0.7 for r in res.recommendations)


def test_discover_bad_input(kb):
    for bad in ("", "   ", "x" * 5000):
        with pytest.raises(QueryError):
            discovery.discover_context(kb, bad)
    with pytest.raises(QueryError) as exc:
        discovery.discover_context(kb, "write tests", task_type="deploy")
    assert all(t in exc.value.message + exc.value.data["guidance"] for t in discovery.TASK_TYPES)
    assert exc.value.exit_code == 6 and exc.value.data["allowed"] == list(discovery.TASK_TYPES)
    with pytest.raises(QueryError):
        discovery.discover_context(kb, "write tests", max_results=0)
    with pytest.raises(CollectionError):
        discovery.discover_context(kb, "write tests", collections=["nope"])


def test_resources_on_the_golden_set(kb):
    listed = discovery.list_knowledge_resources(kb)
    resources = listed["resources"]
    assert listed["total"] == 9 and listed["next_cursor"] is None
    uris = {r["uri"] for r in resources}
    assert "knowledge://knowledge/knowledge/guidelines/testing.md" in uris and len(resources) == 9
    res = next(r for r in resources if r["uri"].endswith("testing.md"))
    assert res["mimeType"] == "text/markdown" and res["name"] == "Testing Guidelines"
    assert res["metadata"]["id"] == "guidelines.testing" and res["metadata"]["node_count"] == 4
    text, meta = discovery.read_knowledge_resource(kb, "knowledge", "knowledge/guidelines/testing.md")
    # The whole file, in document order, without the metadata bullets.
    order = [text.index(h) for h in ("# Testing Guidelines", "## Fixtures and isolation", "## Fakes instead",
                                     "## Flaky tests")]
    assert order == sorted(order) and "- id:" not in text and meta["node_count"] == 4
    section, smeta = discovery.read_knowledge_resource(kb, "knowledge", "knowledge/guidelines/testing.md",
                                                       "flaky-tests")
    assert section.startswith("## Flaky tests") and smeta["id"] == "guidelines.testing.flaky"
    with pytest.raises(DocumentError):
        discovery.read_knowledge_resource(kb, "knowledge", "knowledge/nope.md")
    with pytest.raises(DocumentError):
        discovery.read_knowledge_resource(kb, "knowledge", "knowledge/guidelines/testing.md", "nope")


def test_search_knowledge_wraps_the_query_engine(kb):
    res = discovery.search_knowledge(kb, "cursor pagination", search_type="keyword", scope=["knowledge"],
                                     max_results=3)
    assert res.mode == "keyword" and res.collections == ["knowledge"] and len(res.results) <= 3
    assert res.results[0].metadata["node_id"] == "guidelines.api.pagination"
    assert discovery.search_knowledge(kb, "cursor pagination", scope="knowledge").mode == "hybrid"
    with pytest.raises(QueryError):
        discovery.search_knowledge(kb, "x", search_type="fuzzy")


# -- unit tests on small knowledge bases (fake embedder) ----------------------------------------------
PLAN = """# Plan
- id: plan
- type: plan
- status: active
- last_checked: 2025-01-01
<!-- content -->
The orchard plan.

## Apples
- id: a
- type: task
- status: active
- blocked_by: [c]
<!-- content -->
Task A is about **apples** and [the orchard](https://example.org).

## Bananas
- id: b
- type: task
- status: done
- blocked_by: [a]
<!-- content -->
Task B is about bananas.

## Cherries
- id: c
- type: task
- blocked_by: [b, ghost]
<!-- content -->
Task C is about cherries.

### Cherry script
- id: c1
<!-- content -->
Run the picking script.

```python
print("cherry")
```
"""

NOTES = """# Notes
- id: notes
- type: context
- status: draft
<!-- content -->
Shared notes about apples; the id `a` exists in the other collection too.

## Apples
- id: a
- type: context
<!-- content -->
Another node with id a.
"""


@pytest.fixture
def small(container, fake_embedder, tmp_path):
    folder = tmp_path / "work" / "kb"
    folder.mkdir()
    (folder / "plan.md").write_text(PLAN)
    collections.create_collection(container, "orchard")
    ingest.ingest_path(container, folder, "orchard")
    return container


def test_retrieve_reassembles_in_order_with_children_and_formats(small):
    res = discovery.retrieve_knowledge(small, ["c"])
    (node,) = res.nodes
    assert node.content == "## Cherries\n\nTask C is about cherries." and node.children == []
    assert node.metadata["blocked_by"] == ["b", "ghost"] and node.metadata["children"] == ["c1"]
    assert node.path == "kb/plan.md#cherries" and res.total_tokens == node.tokens
    deep = discovery.retrieve_knowledge(small, ["plan"], include_children=True)
    root = deep.nodes[0]
    assert [k.id for k in root.children] == ["a", "b", "c"] and root.children[2].children[0].id == "c1"
    assert "```python" in root.children[2].children[0].content
    assert deep.total_tokens == sum(n.tokens for n in (root, *root.children, root.children[2].children[0]))
    plain = discovery.retrieve_knowledge(small, ["a", "c1"], format="plain")
    assert plain.nodes[0].content == "Apples\n\nTask A is about apples and the orchard."
    assert "```" not in plain.nodes[1].content and 'print("cherry")' in plain.nodes[1].content
    js = discovery.retrieve_knowledge(small, ["c1"], format="json")
    kinds = [s.content_type for s in js.nodes[0].sections]
    assert kinds == ["prose", "code_block"] and js.nodes[0].sections[1].code_language == "python"
    assert js.model_dump(mode="json")["nodes"][0]["sections"][0]["header_path"] == "Plan > Cherries > Cherry script"


def test_retrieve_not_found_and_limits(small):
    res = discovery.retrieve_knowledge(small, ["a", "nope", "a"])
    assert [n.id for n in res.nodes] == ["a"] and res.not_found == ["nope"] and "nope" in res.message
    with pytest.raises(DocumentError) as exc:
        discovery.retrieve_knowledge(small, ["nope", "gone"])
    assert exc.value.data["not_found"] == ["nope", "gone"] and "nope" in exc.value.message
    with pytest.raises(QueryError, match="at most 20"):
        discovery.retrieve_knowledge(small, [f"id{i}" for i in range(21)])
    with pytest.raises(QueryError):
        discovery.retrieve_knowledge(small, [])
    with pytest.raises(QueryError, match="Unknown format"):
        discovery.retrieve_knowledge(small, ["a"], format="html")


def test_same_id_in_two_collections_needs_the_collection_prefix(small, tmp_path):
    other = tmp_path / "work" / "notes"
    other.mkdir()
    (other / "notes.md").write_text(NOTES)
    collections.create_collection(small, "notes")
    ingest.ingest_path(small, other, "notes")
    res = discovery.retrieve_knowledge(small, ["a", "notes:a", "orchard:a"])
    assert [(n.collection, n.id) for n in res.nodes] == [("notes", "a"), ("orchard", "a")]
    assert res.not_found == ["a"] and "several collections" in res.message
    assert discovery.retrieve_knowledge(small, ["a"], collections=["orchard"]).nodes[0].collection == "orchard"
    found = discovery.discover_context(small, "apples orchard task")
    assert {r.id for r in found.recommendations if r.title == "Apples"} <= {"notes:a", "orchard:a"}


def test_dependencies_cycles_depth_and_missing(small):
    up = discovery.get_dependencies(small, "a", direction="upstream")
    assert {n.id for n in up.nodes} == {"c", "plan"} and all(n.distance == 1 for n in up.nodes)
    assert {(e.source, e.target, e.kind) for e in up.edges} == {("a", "c", "blocked_by"), ("a", "plan", "child_of")}
    deep = discovery.get_dependencies(small, "a", direction="upstream", depth=3)
    assert {n.id for n in deep.nodes} == {"c", "plan", "b"}  # a is not revisited through the cycle
    assert deep.cycles == [["a", "c", "b"]] and deep.missing == ["ghost"]
    down = discovery.get_dependencies(small, "a", direction="downstream")
    assert [(n.id, n.distance) for n in down.nodes] == [("b", 1)]
    assert [(e.source, e.target, e.kind) for e in down.edges] == [("b", "a", "blocked_by")]
    both = discovery.get_dependencies(small, "c", direction="both")
    assert {n.id for n in both.nodes} == {"b", "plan", "a", "c1"}
    capped = discovery.get_dependencies(small, "a", depth=99)
    assert capped.depth == small.settings.max_dependency_depth and capped.depth_capped
    for bad in ({"direction": "sideways"}, {"depth": 0}):
        with pytest.raises(QueryError):
            discovery.get_dependencies(small, "a", **bad)
    with pytest.raises(DocumentError):
        discovery.get_dependencies(small, "nope")


def test_list_knowledge_bases_and_filters(small):
    kbs = discovery.list_knowledge_bases(small)
    (entry,) = kbs.knowledge_bases
    assert (entry.id, entry.path, entry.title, entry.type, entry.status) == ("plan", "kb/plan.md", "Plan", "plan",
                                                                              "active")
    assert entry.node_count == 5 and entry.last_checked == "2025-01-01" and entry.description == "The orchard plan."
    tasks = discovery.list_knowledge_bases(small, filter_type="task")
    # c1 has no type or status of its own: it inherits c's type (task) and the plan's status (active).
    assert [n.id for n in tasks.knowledge_bases[0].nodes] == ["a", "b", "c", "c1"] and tasks.total_nodes == 4
    active = discovery.list_knowledge_bases(small, filter_status="active")
    assert [n.id for n in active.knowledge_bases[0].nodes] == ["plan", "a", "c", "c1"]
    assert discovery.list_knowledge_bases(small, filter_type="guideline").knowledge_bases == []


def test_list_knowledge_bases_pages_every_file_once_with_totals_of_every_match(container, fake_embedder, tmp_path):
    # Issue 15: the library pages the catalogue (catalog/common.py paginate), so the MCP tool is a thin call and
    # a library caller gets the same pages; total_files/total_nodes count every match, not the page.
    for name, files in (("orchard", 5), ("grove", 2)):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(files):
            (folder / f"f{i}.md").write_text(f"# File {i}\n- id: {name}-{i}\n- type: {'task' if i % 2 else 'plan'}\n"
                                             f"<!-- content -->\nText {i}.\n\n## Part\nMore about {i}.\n")
        collections.create_collection(container, name)
        ingest.ingest_path(container, folder, name)
    seen, sizes, cursor = [], [], None
    for _ in range(10):
        page = discovery.list_knowledge_bases(container, limit=3, cursor=cursor)
        assert (page.total_files, page.total_nodes) == (7, 14)
        seen += [f"{b.collection}/{b.path}" for b in page.knowledge_bases]
        sizes.append(len(page.knowledge_bases))
        if (cursor := page.next_cursor) is None:
            break
    assert sizes == [3, 3, 1] and seen == sorted(seen) and len(set(seen)) == 7
    tasks = discovery.list_knowledge_bases(container, filter_type="task", limit=2)  # grove f1, orchard f1, f3
    assert len(tasks.knowledge_bases) == 2 and (tasks.total_files, tasks.total_nodes) == (3, 6) and tasks.next_cursor
    rest = discovery.list_knowledge_bases(container, filter_type="task", limit=2, cursor=tasks.next_cursor)
    assert rest.next_cursor is None and [b.id for b in tasks.knowledge_bases + rest.knowledge_bases] == [
        "grove-1", "orchard-1", "orchard-3"]
    assert discovery.list_knowledge_bases(container).next_cursor is None  # 7 files fit the default page
    with pytest.raises(QueryError):
        discovery.list_knowledge_bases(container, limit=0)
    with pytest.raises(QueryError):
        discovery.list_knowledge_bases(container, cursor="not-a-cursor")


def test_index_follows_reingest(small, tmp_path):
    before = discovery.retrieve_knowledge(small, ["a"]).nodes[0].content
    (tmp_path / "work" / "kb" / "plan.md").write_text(PLAN.replace("about **apples**", "about pears"))
    ingest.ingest_path(small, tmp_path / "work" / "kb", "orchard")
    after = discovery.retrieve_knowledge(small, ["a"]).nodes[0].content
    assert "apples" in before and "pears" in after and "apples" not in after


def test_boosts_file_override_and_errors(container, fake_embedder, tmp_path, monkeypatch):
    default = discovery.load_boosts()
    assert set(default["task_types"]) == set(discovery.TASK_TYPES)
    assert default["task_types"]["debug"] == {"guideline": 1.0, "protocol": 1.3, "context": 1.5, "agent_skill": 0.8}
    custom = tmp_path / "boosts.yaml"
    custom.write_text("task_types:\n  debug: {context: 3.0}\nstatus: {draft: 0.1}\n")
    merged = discovery.load_boosts(custom)
    assert merged["task_types"]["debug"]["context"] == 3.0 and merged["task_types"]["debug"]["protocol"] == 1.3
    assert merged["status"]["draft"] == 0.1 and merged["status"]["active"] == 1.1
    custom.write_text("task_types:\n  debug: {context: lots}\n")
    with pytest.raises(ConfigError, match="task_types.debug.context"):
        discovery.load_boosts(custom)
    custom.write_text("task_types: [oops\n")
    with pytest.raises(ConfigError):
        discovery.load_boosts(custom)
    with pytest.raises(ConfigError):
        discovery.load_boosts(tmp_path / "missing.yaml")


def test_collapse_rule_prefers_parent_only_for_close_children():
    def node(nid, parent=None, children=(), tokens=100):
        return make_node(nid, parent, children, tokens, document="d.md")

    nodes = {"p": node("p", children=["x", "y", "z"], tokens=10), "x": node("x", "p"), "y": node("y", "p"),
             "z": node("z", "p")}
    ix = discovery.NodeIndex("k", nodes, list(nodes), None, None, {}, {"d.md": list(nodes)})

    def scored(scores, dense=None):
        dense = dense or {}
        # Each child matches a word of its own, so siblings complement each other (the parent answers more).
        return [ranking.Scored(nodes[k], ix, s, dense.get(k, 0.5), 0.0, 0.0, [], [k], []) for k, s in scores.items()]

    kept = ranking.collapse(scored({"p": 0.3, "x": 0.95, "y": 0.9, "z": 0.2}), 0.5, 3000)
    assert [(s.node.id, s.include_children, round(s.score, 2)) for s in kept] == [("p", True, 0.95)]
    # A runner-up the calibrated score puts far below the leader still matches when its cosine is as close.
    kept = ranking.collapse(scored({"p": 0.3, "x": 0.9, "y": 0.45, "z": 0.2}, {"y": 0.45}), 0.5, 3000)
    assert [(s.node.id, s.include_children, round(s.score, 2)) for s in kept] == [("p", True, 0.9)]
    # One clear winner (the other child's cosine is far below, or its score under 0.4): no collapse.
    for runner_up in (({"y": 0.72}, {"y": 0.3}), ({"y": 0.35}, {})):
        scores = {"p": 0.3, "x": 0.95, "z": 0.1, **runner_up[0]}
        kept = ranking.collapse(scored(scores, runner_up[1]), 0.5, 3000)
        assert sorted(s.node.id for s in kept) == ["p", "x", "y", "z"] and not any(s.include_children for s in kept)
    # A parent too large to load whole is not collapsed into.
    kept = ranking.collapse(scored({"p": 0.3, "x": 0.95, "y": 0.9, "z": 0.2}), 0.5, 250)
    assert not any(s.include_children for s in kept)
    # Two children matching the same task words are alternatives, not parts: no collapse.
    same = scored({"p": 0.3, "x": 0.95, "y": 0.9, "z": 0.2})
    for s in same:
        s.matched_body = ["slack"]
    assert not any(s.include_children for s in ranking.collapse(same, 0.5, 3000))


def test_collapse_needs_most_of_the_parents_children():
    """A server with 8 tools, two of which match, is two tools, not the server (issue 14: 31 of 139 top-3
    answers on the ToolGym set were whole server files)."""
    def node(nid, parent=None, children=(), tokens=30):
        return make_node(nid, parent, children, tokens)

    tools = [f"t{i}" for i in range(8)]
    nodes = {"root": node("root", children=tools, tokens=20), **{t: node(t, "root") for t in tools}}
    ix = discovery.NodeIndex("k", nodes, list(nodes), None, None, {}, {"s.md": list(nodes)})
    scores = {"root": 0.2, "t0": 0.92, "t1": 0.88, **{t: 0.05 for t in tools[2:]}}
    scored = [ranking.Scored(nodes[k], ix, s, 0.6, 0.0, 0.0, [], [k], []) for k, s in scores.items()]
    ranked, listed = ranking.rank(scored, 0.5, 3000)
    assert [s.node.id for s in listed[:2]] == ["t0", "t1"] and not any(s.include_children for s in ranked)
    # The thin root (20 tokens, no collapse) is not listed at all.
    assert "root" not in [s.node.id for s in ranked]


def test_prompts_name_our_tools():
    prep = discovery.task_preparation_prompt("Add OAuth login")
    assert "Add OAuth login" in prep
    for tool in ("discover_context", "retrieve_knowledge", "get_dependencies", "search_knowledge"):
        assert f"`{tool}`" in prep
    audit = discovery.knowledge_audit_prompt("Add OAuth login", ["context.architecture.auth", "guidelines.api"])
    assert "context.architecture.auth, guidelines.api" in audit and "`discover_context`" in audit
    assert "(none)" in discovery.knowledge_audit_prompt("x", [])


def test_empty_store_and_empty_collection(container, fake_embedder):
    assert discovery.list_knowledge_bases(container).knowledge_bases == []
    assert discovery.list_knowledge_resources(container) == {"resources": [], "total": 0, "next_cursor": None}
    collections.create_collection(container, "empty")
    res = discovery.discover_context(container, "anything at all here")
    assert res.recommendations == [] and res.total_available == 0 and "No knowledge relevant" in res.message
    with pytest.raises(DocumentError):
        discovery.retrieve_knowledge(container, ["x"])


def test_search_knowledge_scope_is_collections_or_a_project(small):
    from research_agent.catalog import projects

    projects.create_project(small, "farm")
    projects.set_default_collections(small, "farm", ["orchard"])
    by_project = discovery.search_knowledge(small, "cherries", scope="farm", search_type="keyword")
    assert by_project.collections == ["orchard"] and by_project.results[0].metadata["node_id"] in ("c", "c1")
    assert discovery.search_knowledge(small, "cherries", scope=["orchard"]).collections == ["orchard"]
    with pytest.raises(CollectionError):
        discovery.search_knowledge(small, "cherries", scope=["nope"])


def test_boosts_file_setting_is_merged_over_the_shipped_matrix(tmp_path, monkeypatch):
    from research_agent.container import build_container
    from research_agent.discovery import load_boosts

    custom = tmp_path / "boosts.yaml"
    custom.write_text("task_types:\n  implement: {guideline: 2.5}\n")
    monkeypatch.setenv("RESEARCH_AGENT_DISCOVERY_BOOSTS_FILE", str(custom))
    c = build_container()
    assert c.settings.discovery_boosts_file == custom
    merged = load_boosts(c.settings.discovery_boosts_file)
    assert merged["task_types"]["implement"]["guideline"] == 2.5
    assert merged["task_types"]["implement"]["protocol"] == load_boosts()["task_types"]["implement"]["protocol"]


# -- issue 14: generic tasks and a word-salad document ---------------------------------------------------
@pytest.mark.parametrize("task,task_type", [("fix it", "debug"), ("update the docs", None), ("fix the bug", None)])
def test_one_or_two_generic_words_recommend_nothing(kb, task, task_type):
    """Fewer than three content words count as padded with unknown words (docs/discovery.md): no node >= 0.5."""
    res = discovery.discover_context(kb, task, task_type=task_type)
    assert res.total_available == 0, [(r.id, r.relevance_score) for r in res.recommendations]
    assert all(r.relevance_score < 0.5 for r in res.recommendations)


def _salad(tasks: list[str], n_words: int = 1500, seed: int = 7) -> str:
    """~1,500 words of the knowledge base's own vocabulary, shuffled, plus every content word of `tasks`."""
    import random
    import re

    vocab = sorted({w.lower() for f in sorted(KNOWLEDGE.rglob("*.md"))
                    for w in re.findall(r"[A-Za-z]{3,}", f.read_text(encoding="utf-8"))})
    rng = random.Random(seed)
    words = [rng.choice(vocab) for _ in range(n_words)]
    words += [w for t in tasks for w in re.findall(r"[A-Za-z]{3,}", t)]
    rng.shuffle(words)
    lines = [" ".join(words[i:i + 15]) + "." for i in range(0, len(words), 15)]
    return "# Notes\n\n" + "\n".join(lines) + "\n"


@pytest.mark.slow
def test_a_word_salad_document_does_not_take_over_no_match_tasks(tmp_path, monkeypatch):
    """One file of common words plus the rare words of unrelated tasks: coverage alone must not reach 0.5."""
    import shutil

    from research_agent.container import build_container

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    no_match = [t["task"] for t in GOLDEN if not t["expected"]] + [
        "Set up Kubernetes autoscaling for the GPU inference cluster",
        "Write a haiku about autumn leaves falling in Kyoto",
        "Negotiate the office lease renewal with the landlord",
        "Calibrate the telescope mount for astrophotography tonight",
        "Plan a vegan menu for a wedding of 120 guests",
    ]
    kb_dir = tmp_path / "kb"
    shutil.copytree(KNOWLEDGE, kb_dir)
    (kb_dir / "salad.md").write_text(_salad(no_match), encoding="utf-8")
    c = build_container(store=str(tmp_path / "store"))
    try:
        collections.create_collection(c, "knowledge", type="fundamental")
        ingest.ingest_path(c, kb_dir, "knowledge", recursive=True, include=["*.md"])
        taken = [t for t in no_match if discovery.discover_context(c, t).total_available]
        assert len(no_match) >= 10 and taken == [], taken
        # The real tasks still find their nodes with the salad in the knowledge base.
        real = [t for t in GOLDEN if t["expected"]]
        hits = sum(_rank(discovery.discover_context(c, t["task"], task_type=t["task_type"]).recommendations,
                         set(t["expected"])) is not None for t in real)
        assert hits >= 0.85 * len(real)
    finally:
        c.close()
