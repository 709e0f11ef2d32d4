"""Tests for research_agent.ingest.chunking: header paths, whole code blocks and tables, hybrid nodes."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from research_agent.ingest.chunking import Chunk, chunk_document, embedding_context, estimate_tokens, slugify
from research_agent.ingest.nodes import STORED_EXTRA_KEYS, STORED_KEYS, NodeFields, from_metadata, to_metadata
from research_agent.ingest.parsing import ParsedDocument, parse_file, parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "docs"


def chunks_of(name: str, **kwargs) -> list[Chunk]:
    return chunk_document(parse_file(FIXTURES / name), source=name, **kwargs)


def derived_id(source: str, header_path: str) -> str:
    return "n-" + hashlib.sha1(f"{source}\n{header_path}".encode()).hexdigest()[:12]


def by_path(chunks: list[Chunk]) -> dict[str, list[Chunk]]:
    out: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        out.setdefault(chunk.header_path, []).append(chunk)
    return out


# -- tokens and slugs --------------------------------------------------------------------------


def test_estimate_tokens() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("  \n\t ") == 0
    assert estimate_tokens("hello world") == 2
    assert estimate_tokens("hello, world!") == 4
    assert estimate_tokens("snake_case_name") == 5  # words and underscores count separately
    assert estimate_tokens("internationalization") == 3  # long words cost extra subword pieces
    prose = "The quick brown fox jumps over the lazy dog, then naps near the riverbank."
    assert len(prose.split()) <= estimate_tokens(prose) <= 1.5 * len(prose.split())


@pytest.mark.parametrize(
    ("header", "slug"),
    [("Install on Linux", "install-on-linux"), ("API Reference (v2)!", "api-reference-v2"),
     ("`foo_bar()` method", "foo_bar-method"), ("[Docs](https://x.org) page", "docs-page"),
     ("Héllo Wörld", "héllo-wörld"), ("", "")],
)
def test_slugify(header: str, slug: str) -> None:
    assert slugify(header) == slug


# -- markdown guides ---------------------------------------------------------------------------


def test_install_guide_structure() -> None:
    chunks = chunks_of("guide_install.md")
    assert [(c.header_path, c.content_type) for c in chunks] == [
        ("", "prose"),
        ("Installation Guide", "prose"),
        ("Installation Guide > Prerequisites", "table"),
        ("Installation Guide > Install > Linux", "prose"),
        ("Installation Guide > Install > Linux", "code_block"),
        ("Installation Guide > Install > Linux", "prose"),
        ("Installation Guide > Install > macOS", "prose"),
        ("Installation Guide > Install > macOS", "code_block"),
        ("Installation Guide > Configuration", "prose"),
    ]
    table = chunks[2]
    assert table.text.startswith("## Prerequisites\n\n| Platform |")  # the section header gives context
    assert table.text.endswith("| Windows  | 11              | via WSL2 |")
    code = chunks[4]
    assert code.code_language == "bash"
    assert code.text == "```bash\npython -m venv .venv\n. .venv/bin/activate\npip install widget-service\n```"
    assert chunks[3].text == "### Linux\n\nInstall the package from PyPI into a virtual environment."
    assert chunks[5].text == "Then check that the command runs."
    assert chunks[7].code_language is None
    assert chunks[3].anchor == "linux" and chunks[0].anchor == ""
    assert all(c.token_count == estimate_tokens(c.text) for c in chunks)
    assert all(c.node.type is None and c.node.status is None and c.node.blocked_by == [] for c in chunks)


def test_install_guide_node_ids_and_parents() -> None:
    chunks = by_path(chunks_of("guide_install.md"))
    linux = chunks["Installation Guide > Install > Linux"][0]
    assert linux.node_id == derived_id("guide_install.md", "Installation Guide > Install > Linux")
    # "## Install" has no content of its own, yet it is still the parent node of its subsections.
    assert linux.node.parent_id == derived_id("guide_install.md", "Installation Guide > Install")
    assert "Installation Guide > Install" not in chunks
    assert chunks["Installation Guide"][0].node.parent_id is None
    assert chunks[""][0].node.parent_id is None
    assert chunks["Installation Guide > Configuration"][0].node.parent_id == derived_id(
        "guide_install.md", "Installation Guide"
    )
    # Ids depend on the source, so the same file under another name gets other ids.
    other = chunk_document(parse_file(FIXTURES / "guide_install.md"), source="copy.md")
    assert other[3].node_id != linux.node_id


def test_api_guide_fenced_comment_is_not_a_header_and_field_lists_stay() -> None:
    chunks = chunks_of("guide_api.md")
    paths = [c.header_path for c in chunks]
    assert sorted(set(paths)) == [
        "API Reference",
        "API Reference > Authentication",
        "API Reference > Endpoints > Create item",
        "API Reference > Endpoints > List items",
        "API Reference > Errors",
    ]
    code = by_path(chunks)["API Reference > Authentication"][1]
    assert code.content_type == "code_block" and code.code_language == "python"
    assert code.text.startswith("~~~python\n") and "# A comment that looks like a header" in code.text
    listing = by_path(chunks)["API Reference > Endpoints > List items"]
    assert [c.content_type for c in listing] == ["prose", "table"]
    assert "- id: the item's identifier\n- status: whether the item is active" in listing[0].text
    assert listing[0].node.type is None and listing[0].node.status is None
    assert listing[1].text.splitlines()[1] == "|:----------|:----:|--------:|"


def test_html_chunks_by_headers() -> None:
    chunks = chunks_of("page.html")
    assert [(c.header_path, c.content_type, c.code_language) for c in chunks] == [
        ("Widget Handbook", "prose", None),
        ("Widget Handbook > Install", "prose", None),
        ("Widget Handbook > Install", "code_block", "bash"),
        ("Widget Handbook > Install > Supported platforms", "table", None),
        ("Widget Handbook > Usage", "prose", None),
    ]


# -- hybrid node format ------------------------------------------------------------------------


def test_hybrid_duplicate_metadata_blocks_merge_last_wins() -> None:
    chunks = chunks_of("hybrid_duplicate_metadata.md")
    nodes = {c.node_id: c for c in chunks}
    assert list(nodes) == ["release-plan", "migrate-storage", "schema-review", "announce"]
    plan = nodes["release-plan"]
    assert (plan.node.type, plan.node.status, plan.node.labels) == ("epic", "in-progress", ["release", "q3"])
    assert plan.node.parent_id is None
    assert plan.text == "# Release Plan\n\nPlan for the 2.0 release."
    migrate = nodes["migrate-storage"]
    assert (migrate.node.type, migrate.node.status, migrate.node.blocked_by) == ("task", "blocked", ["schema-review"])
    assert migrate.node.parent_id == "release-plan"
    assert migrate.text == "## Migrate storage\n\nMove every collection to the new storage layout."
    review = nodes["schema-review"]
    assert (review.node.status, review.node.last_checked) == ("done", "2024-06-01")
    assert review.node.extra == {"priority": "high"}
    assert review.text == "## Schema review\n\nReviewed by the platform team."
    # A node with metadata but no content still yields a chunk, so dependency queries can find it.
    announce = nodes["announce"]
    assert announce.text == "## Announce"
    assert announce.node.blocked_by == ["migrate-storage", "schema-review"]
    assert not any("<!--" in c.text or "- id:" in c.text for c in chunks)


def test_hybrid_missing_separator_and_document_node() -> None:
    chunks = chunks_of("hybrid_missing_separator.md")
    nodes = {c.header_path: c for c in chunks}
    top = nodes[""]
    assert (top.node_id, top.node.type, top.text) == ("onboarding", "project", "Tasks for new team members.")
    accounts = nodes["Accounts"]
    assert (accounts.node_id, accounts.node.status, accounts.node.parent_id) == ("accounts", "done", "onboarding")
    assert accounts.text == "# Accounts\n\nCreate accounts in the issue tracker and the chat."
    laptop = nodes["Laptop"]
    assert (laptop.node_id, laptop.node.blocked_by) == ("laptop", ["accounts"])
    assert laptop.text == "# Laptop\n\nSet up the laptop with the standard image."
    reading = nodes["Reading"]  # a separator without metadata is dropped; the id is derived
    assert reading.node_id == derived_id("hybrid_missing_separator.md", "Reading")
    assert reading.text == "# Reading\n\nRead the architecture overview first."
    notes = nodes["Notes"]  # ordinary "Word: value" bullets are content, not metadata
    assert notes.text == "# Notes\n\n- Remember: bring a badge photo\n- Parking: level 2"
    assert (notes.node.type, notes.node.parent_id) == (None, "onboarding")


def test_hybrid_headers_in_code_fences_are_not_nodes() -> None:
    chunks = chunks_of("hybrid_headers_in_fences.md")
    assert [(c.header_path, c.content_type, c.node_id) for c in chunks] == [
        ("Build System", "prose", "build"),
        ("Build System > Script", "code_block", "build-script"),
        ("Build System > Script", "code_block", "build-script"),
        ("Build System > Targets", "prose", "build-targets"),
        ("Build System > Targets", "code_block", "build-targets"),
    ]
    script = chunks[1]
    assert script.text.startswith("## Script\n\n```bash\n#!/bin/sh\n# Not a header")
    assert (script.node.blocked_by, script.node.type, script.node.parent_id) == ([], "file", "build")
    nested = chunks[2]
    assert nested.code_language == "markdown"
    assert nested.text.endswith("```\n## nested fence text\n```\n````")
    unclosed = chunks[4]  # runs to the end of the file and is closed for display
    assert "## so this is not a node either" in unclosed.text and unclosed.text.endswith("\n```")


def test_metadata_detection_rules() -> None:
    def first(markdown: str) -> Chunk:
        return chunk_document(parse_text(markdown), source="t.md")[0]

    # Unknown keys count as metadata only when a separator follows.
    owned = first("# A\n- owner: bob\n- team: core\n<!-- content -->\nBody.\n")
    assert (owned.node.extra, owned.text) == ({"owner": "bob", "team": "core"}, "# A\n\nBody.")
    kept = first("# A\n- owner: bob\n- team: core\n\nBody.\n")
    assert kept.text == "# A\n\n- owner: bob\n- team: core\n\nBody." and kept.node.extra == {}
    # Known keys with sentence-like values read as an API field list, not metadata.
    fields = first("# A\n- id: the user's id\n- status: current account status\n")
    assert "- id: the user's id" in fields.text and fields.node.status is None
    # A list that goes on with plain items is content.
    mixed = first("# A\n- status: open\n- buy milk\n")
    assert mixed.node.status is None and "- buy milk" in mixed.text
    # Bold keys, quoted values, dashed keys and "none" lists.
    bold = first('# A\n- **id**: "x-1"\n- Last-Checked: 2024-01-02\n- blocked_by: none\n- label: ui\n\nText\n')
    assert (bold.node_id, bold.node.last_checked) == ("x-1", "2024-01-02")
    assert (bold.node.blocked_by, bold.node.labels) == ([], ["ui"])
    # Front matter id/type/status make the document node; its headers hang below it.
    doc = chunk_document(parse_text("---\nid: spec\ntype: doc\n---\nIntro\n\n# Part\nText\n"), source="s.md")
    assert [(c.node_id, c.node.type, c.node.parent_id) for c in doc] == [
        ("spec", "doc", None), (derived_id("s.md", "Part"), None, "spec")]


def test_repeated_headers_get_distinct_ids_and_anchors() -> None:
    chunks = chunk_document(parse_text("# A\n## Example\none\n# B\n## Example\ntwo\n# A\n## Example\nthree\n"),
                            source="r.md")
    examples = [c for c in chunks if c.header_path.endswith("Example")]
    assert [c.anchor for c in examples] == ["example", "example-1", "example-2"]
    assert len({c.node_id for c in examples}) == 3
    assert examples[0].node_id == derived_id("r.md", "A > Example")
    assert examples[2].node.parent_id != examples[0].node.parent_id  # the second "# A" is its own node


# -- sizes -------------------------------------------------------------------------------------


def test_long_prose_is_packed_and_split_by_sentences() -> None:
    sentences = [f"Sentence number {i} talks about chunking rules." for i in range(60)]
    text = "# Long\n\n" + " ".join(sentences[:30]) + "\n\n" + " ".join(sentences[30:]) + "\n"
    chunks = chunk_document(parse_text(text), source="l.md", max_tokens=50)
    assert len(chunks) > 5
    assert all(c.token_count <= 50 for c in chunks)
    assert chunks[0].text.startswith("# Long\n\nSentence number 0")
    assert not any(c.text.startswith("# Long") for c in chunks[1:])
    joined = " ".join(c.text for c in chunks).replace("# Long", "").split()
    assert joined == " ".join(sentences).split()  # nothing lost, nothing repeated, order kept


def test_paragraph_without_punctuation_splits_on_words() -> None:
    words = " ".join(f"word{i}" for i in range(500))
    chunks = chunk_document(ParsedDocument(text=words, format="text"), source="w.txt", max_tokens=40)
    assert all(0 < c.token_count <= 40 for c in chunks)
    assert " ".join(c.text for c in chunks) == words


def test_code_blocks_and_tables_stay_whole_within_the_limit_and_split_over_it() -> None:
    code = "\n".join(f"print({i})" for i in range(100))
    table = "| a | b |\n|---|---|\n" + "\n".join(f"| {i} | {i * 2} |" for i in range(100))
    markdown = f"# T\n\n```python\n{code}\n```\n\n{table}\n"
    whole = chunk_document(parse_text(markdown), source="t.md", max_tokens=2000)
    assert [c.content_type for c in whole] == ["code_block", "table"]
    assert whole[0].text == f"# T\n\n```python\n{code}\n```"
    assert whole[1].text == table
    split = chunk_document(parse_text(markdown), source="t.md", max_tokens=60)
    code_parts = [c for c in split if c.content_type == "code_block"]
    tables = [c for c in split if c.content_type == "table"]
    assert len(code_parts) > 1 and len(tables) > 1
    assert all(c.token_count <= 60 for c in split)
    # Code pieces stay fenced; table pieces repeat the header row; nothing is lost or repeated.
    assert code_parts[0].text.startswith("# T\n\n```python\nprint(0)")
    assert all(c.text.split("\n")[-1] == "```" and "```python" in c.text for c in code_parts)
    assert [line for c in code_parts for line in c.text.split("\n") if line.startswith("print")] == code.split("\n")
    assert all(c.text.startswith("| a | b |\n|---|---|\n") for c in tables)
    assert [line for c in tables for line in c.text.split("\n")[2:]] == table.split("\n")[2:]


def test_overlap_repeats_the_tail_of_the_previous_chunk() -> None:
    text = "\n\n".join(f"Paragraph {i} has exactly seven words here." for i in range(10))
    chunks = chunk_document(ParsedDocument(text=text, format="text"), source="o.txt", max_tokens=30,
                            overlap_tokens=4)
    assert len(chunks) > 2
    for previous, chunk in zip(chunks, chunks[1:]):
        repeated = chunk.text.split("\n\n")[0]
        assert previous.text.endswith(repeated) and 0 < estimate_tokens(repeated) <= 4


def test_empty_documents_give_no_chunks() -> None:
    for fmt in ("markdown", "text", "code", "html"):
        assert chunk_document(ParsedDocument(text=" \n\n\t\n", format=fmt), source="e") == []
    assert chunk_document(parse_text("# \n```\n```\n<!-- content -->\n"), source="e.md") == []


# -- other formats -----------------------------------------------------------------------------


def test_text_paragraphs_are_packed() -> None:
    chunks = chunk_document(ParsedDocument(text="One.\n\nTwo.\n\n\nThree.", format="text"), source="a.txt")
    assert len(chunks) == 1
    assert (chunks[0].text, chunks[0].content_type, chunks[0].header_path) == ("One.\n\nTwo.\n\nThree.", "prose", "")
    assert chunks[0].node_id == derived_id("a.txt", "")


def test_code_file_split_on_top_level_blocks(monkeypatch) -> None:
    # The fallback split (no grammar, no tree-sitter, a broken file); syntax-tree chunks: tests/test_code_chunks.py.
    monkeypatch.setattr("research_agent.ingest.code_chunks.code_chunks", lambda *a, **k: None)
    source = (
        "@decorator\ndef alpha(x):\n    y = x + 1\n\n    return y\n\n\n"
        "class Beta:\n    def method(self):\n        return 0\n\n    def other(self):\n        pass\n\n\n"
        "async def gamma():\n    return 3\n"
    )
    doc = parse_text(source, format="code", name="mod.py")
    chunks = chunk_document(doc, source="mod.py", max_tokens=20)
    assert [c.header_path for c in chunks] == ["alpha", "Beta", "gamma"]
    assert all(c.content_type == "code_block" and c.code_language == "python" for c in chunks)
    assert chunks[0].text == "@decorator\ndef alpha(x):\n    y = x + 1\n\n    return y"
    assert "def other" in chunks[1].text  # indented blank-line breaks stay inside the block
    packed = chunk_document(doc, source="mod.py")
    # Packed blocks are joined by one blank line, so runs of blank lines between them shrink to one.
    assert len(packed) == 1 and packed[0].text == source.strip().replace("\n\n\n", "\n\n")


def test_go_and_js_symbols(monkeypatch) -> None:
    monkeypatch.setattr("research_agent.ingest.code_chunks.code_chunks", lambda *a, **k: None)
    go = "package main\n\nfunc (s *Server) Start() error {\n\treturn nil\n}\n"
    js = "export async function load() {\n  return 1;\n}\n"
    go_chunks = chunk_document(parse_text(go, format="code", name="s.go"), source="s.go", max_tokens=15)
    assert [c.header_path for c in go_chunks] == ["", "Start"]
    assert chunk_document(parse_text(js, format="code", name="l.js"), source="l.js")[0].header_path == "load"


def test_pdf_pages_become_page_headers() -> None:
    doc = ParsedDocument(text="A.\n\nB.", format="pdf", pages=[(1, "Alpha page."), (3, "Gamma one.\n\nGamma two.")])
    chunks = chunk_document(doc, source="p.pdf")
    assert [(c.header_path, c.page, c.text) for c in chunks] == [
        ("Page 1", 1, "Alpha page."), ("Page 3", 3, "Gamma one.\n\nGamma two.")]
    assert chunks[1].node_id == derived_id("p.pdf", "Page 3")


def test_docx_goes_through_the_markdown_path() -> None:
    doc = ParsedDocument(text="# Title\n\nIntro\n\n## Part\n\n| a |\n|---|\n| 1 |", format="docx")
    chunks = chunk_document(doc, source="d.docx")
    assert [(c.header_path, c.content_type) for c in chunks] == [("Title", "prose"), ("Title > Part", "table")]


# -- never crash, never empty ------------------------------------------------------------------

_MARKDOWN_LINES = st.sampled_from([
    "", "# Title", "## Sub", "###### Deep", "#", "```", "```py", "~~~", "````", "- id: a", "- status: open",
    "- blocked_by: [a, b]", "- id:", "<!-- content -->", "| a | b |", "|---|---|", "| 1 | 2 |", "plain text.",
    "Sentence one. Sentence two!", "    indented", "- item", "* star: x", "  ", "\t",
])
_MARKDOWN = st.one_of(st.text(), st.lists(st.one_of(_MARKDOWN_LINES, st.text(max_size=30)), max_size=40).map("\n".join))


@settings(max_examples=200, deadline=None)
@given(text=_MARKDOWN, max_tokens=st.integers(min_value=1, max_value=60), overlap=st.integers(0, 10))
def test_chunk_document_never_raises_or_emits_empty_chunks(text: str, max_tokens: int, overlap: int) -> None:
    chunks = chunk_document(ParsedDocument(text=text, format="markdown"), source="h.md", max_tokens=max_tokens,
                            overlap_tokens=overlap)
    for chunk in chunks:
        assert chunk.text.strip()
        assert chunk.token_count == estimate_tokens(chunk.text) > 0
        assert chunk.token_count <= max_tokens  # a hard bound, tables and code blocks included
        assert chunk.content_type in ("prose", "code_block", "table")
        assert chunk.node_id


def _char_counter(texts: list[str]) -> list[int]:
    """Characters as tokens: unlike the estimate, joins count too (a line break is a token), as some
    tokenizers count a joined text differently from its parts."""
    return [len(t) for t in texts]


@settings(max_examples=150, deadline=None)
@given(text=_MARKDOWN, budget=st.integers(min_value=1, max_value=80), limit=st.integers(min_value=8, max_value=120))
def test_chunks_fit_any_counter_and_model_limit_exactly(text: str, budget: int, limit: int) -> None:
    chunks = chunk_document(ParsedDocument(text=text, format="markdown", title="Doc"), source="h.md", max_tokens=budget,
                            count_tokens=_char_counter, model_max_tokens=limit, max_bytes=200)
    for chunk in chunks:
        room = min(budget, limit - len(embedding_context("Doc", chunk.header_path)) - 1)
        assert chunk.text.strip() and len(chunk.text) <= max(1, room), (chunk.header_path, chunk.text)
        assert len(chunk.text.encode("utf-8")) <= 200


# -- documents made only of structure (headings, front matter) -------------------------------------
_OUTLINE = "# Release checklist\n## Bump the version\n## Tag the release\n### Publish wheels to PyPI\n"


def test_a_headings_only_document_is_one_outline_chunk_of_its_headings() -> None:
    chunks = chunk_document(parse_text(_OUTLINE), source="checklist.md")
    assert len(chunks) == 1
    assert chunks[0].text == _OUTLINE.strip()
    assert chunks[0].content_type == "prose" and chunks[0].header_path == ""
    assert chunks[0].token_count == estimate_tokens(_OUTLINE.strip())


def test_an_outline_over_the_budget_splits_by_lines_and_keeps_every_heading() -> None:
    text = "".join(f"## Step {i} of the release, done by hand\n" for i in range(60))
    chunks = chunk_document(parse_text(text), source="long.md", max_tokens=40)
    assert len(chunks) > 1 and all(c.token_count <= 40 for c in chunks)
    assert "\n".join(c.text for c in chunks) == text.strip()


@pytest.mark.parametrize("text,expected", [
    ("---\ntitle: Hello world\ndescription: Release notes for 2.0\n---\n", "Hello world\n\nRelease notes for 2.0"),
    ("---\ntitle: Plan\n---\n# Phase one\n## Phase two\n", "Plan\n\n# Phase one\n## Phase two"),
    ("| a | b |\n|---|---|\n| x | y |\n", "| a | b |\n|---|---|\n| x | y |"),   # a table is content already
    ("```py\nprint(1)\n```\n", "```py\nprint(1)\n```"),                            # so is a code fence
])
def test_all_structure_files_keep_their_visible_text(text: str, expected: str) -> None:
    chunks = chunk_document(parse_text(text), source="s.md")
    assert [c.text for c in chunks] == [expected]


@pytest.mark.parametrize("text", ["", "  \n\n\t\n", "```\n```\n", "#\n##\n", "<!-- content -->\n",
                                  "---\ntags: [a, b]\n---\n"])
def test_files_with_no_visible_text_still_have_no_chunks(text: str) -> None:
    assert chunk_document(parse_text(text), source="e.md") == []


def test_a_document_with_a_body_gets_no_outline_chunk() -> None:
    chunks = chunk_document(parse_text("# Title\n## Empty\n## Full\n\nbody text\n"), source="b.md")
    assert [c.text for c in chunks] == ["## Full\n\nbody text"]


# -- the node schema, defined once (issue 13) ----------------------------------------------------

# Modules allowed to still spell out stored node keys themselves (none left: discovery reads nodes back
# through nodes.from_metadata). Each entry is checked to still hold, so fixing a module makes the test fail
# until its line is deleted here.
NODE_SCHEMA_NOT_YET: set[str] = set()
# Same word, another meaning: the name of a dependency edge kind (models.DependencyEdge.kind), and the filter
# `node_type` of query_knowledge (search/filters.py maps a user-facing filter name onto the stored key).
NODE_SCHEMA_OTHER_MEANING = {
    "research_agent/discovery/graph.py": {"blocked_by"},
    "research_agent/discovery/models.py": {"blocked_by"},
    "research_agent/search/filters.py": {"node_type"},
}


def _spelled_node_keys(path: Path) -> set[str]:
    """The stored node keys a module writes as string literals (dict keys, meta.get("node_type") ...)."""
    # "status" and "labels" are ordinary words elsewhere (filters, wire models); the others are the schema's own.
    own = {*STORED_KEYS.values(), *STORED_EXTRA_KEYS.values()} - {"status", "labels"}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in own}


def test_the_node_schema_is_defined_once() -> None:
    root = Path(__file__).resolve().parents[1]
    nodes_py = root / "research_agent" / "ingest" / "nodes.py"
    # The packages that write or read stored chunk metadata; faces and guidance name tool parameters (node_id).
    readers = [p for area in ("ingest", "storage", "search", "discovery", "catalog", "ops")
               for p in sorted((root / "research_agent" / area).rglob("*.py"))]
    spelled = {str(p.relative_to(root)): keys for p in readers if p != nodes_py and (keys := _spelled_node_keys(p))}
    spelled = {path: keys - NODE_SCHEMA_OTHER_MEANING.get(path, set()) for path, keys in spelled.items()}
    spelled = {path: keys for path, keys in spelled.items() if keys}
    assert set(spelled) - NODE_SCHEMA_NOT_YET == set(), f"import the keys from ingest/nodes.py instead: {spelled}"
    fixed = NODE_SCHEMA_NOT_YET - set(spelled)
    assert not fixed, f"fixed: delete from NODE_SCHEMA_NOT_YET {fixed}"


def test_every_node_field_is_stored_and_read_back_unchanged() -> None:
    # A field added to NodeFields without a stored key would be dropped between ingest and discovery.
    assert {f.name for f in fields(NodeFields)} - {"extra"} == set(STORED_KEYS)
    chunks = chunks_of("hybrid_duplicate_metadata.md")
    for chunk in chunks:
        back = from_metadata(to_metadata(chunk.node))
        stored_extra = {k: v for k, v in chunk.node.extra.items() if k in ("title", "description")}
        assert back == NodeFields(**{**chunk.node.__dict__, "extra": stored_extra})
    assert {c.node.blocked_by[0] for c in chunks if c.node.blocked_by} == {"schema-review", "migrate-storage"}


# -- line ranges (issue 17: citations an agent can act on) --------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _file_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")


def test_line_ranges_point_into_the_file_front_matter_counted() -> None:
    path = FIXTURES / "guide_install.md"  # opens with 7 lines of front matter
    lines = _file_lines(path)
    chunks = chunk_document(parse_file(path), source="guide_install.md")
    intro = chunks[0]
    assert intro.text.startswith("This guide covers")
    assert (intro.line_start, intro.line_end) == (lines.index(intro.text) + 1,) * 2 == (9, 9)
    table = next(c for c in chunks if c.content_type == "table")
    assert lines[table.line_start - 1] == "## Prerequisites" and lines[table.line_end - 1].startswith("| Windows")
    code = next(c for c in chunks if c.content_type == "code_block")
    assert lines[code.line_start - 1] == "```bash" and lines[code.line_end - 1] == "```"


@pytest.mark.parametrize("relative", [
    "tests/fixtures/docs/guide_install.md", "tests/fixtures/docs/guide_api.md",
    "tests/fixtures/docs/hybrid_duplicate_metadata.md", "tests/fixtures/docs/hybrid_headers_in_fences.md",
    "tests/fixtures/docs/hybrid_missing_separator.md", "research_agent/ingest/nodes.py", "LICENSE",
])
@pytest.mark.parametrize("max_tokens", [350, 40])
def test_every_chunk_line_lies_within_its_range(relative: str, max_tokens: int, tmp_path: Path) -> None:
    # Real files (markdown with front matter and hybrid metadata, Python, plain text), whole and split small.
    path = REPO / relative
    if path.suffix == "":  # LICENSE has no extension: read it as the .txt it is
        path = tmp_path / "LICENSE.txt"
        path.write_text((REPO / relative).read_text(encoding="utf-8"), encoding="utf-8")
    lines = _file_lines(path)
    chunks = chunk_document(parse_file(path), source=path.name, max_tokens=max_tokens)
    assert chunks
    previous_end = 0
    for chunk in chunks:
        assert chunk.line_start is not None and 1 <= chunk.line_start <= chunk.line_end <= len(lines)
        span = lines[chunk.line_start - 1:chunk.line_end]
        last = chunk.text.split()[-1]  # the chunk's last word is on its last lines (a cut piece inside a word)
        assert any(last in word for word in " ".join(span[-3:]).split()) or last in "```~~~"
        text_lines = chunk.text.split("\n")
        if chunk.content_type == "code_block" and path.suffix == ".py":  # repeated signatures open split pieces
            text_lines = text_lines[-(chunk.line_end - chunk.line_start + 1):]
        for line in (t.strip() for t in text_lines):
            where = [i + 1 for i, s in enumerate(lines) if s.strip() == line]
            if line and len(where) == 1 and not line.startswith(("```", "~~~", "|")):  # markers and table heads repeat
                assert chunk.line_start <= where[0] <= chunk.line_end, (line, chunk.line_start, chunk.line_end)
        assert chunk.line_start >= previous_end - 1  # document order; a split may share its boundary line
        previous_end = chunk.line_end


def test_html_chunks_carry_no_line_range() -> None:
    chunks = chunk_document(parse_file(FIXTURES / "page.html"), source="page.html")
    assert chunks and all(c.line_start is None and c.line_end is None for c in chunks)
