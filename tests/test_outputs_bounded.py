"""Outputs an agent can afford (issue 15): every list is paged with a cursor, a default answer stays near 8k
tokens, the Markdown text never cuts what the tool exists to return, and errors carry their guidance in the
message, in the words of the face that shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research_agent.catalog.common import (
    DEFAULT_PAGE,
    DEFAULT_PAGE_BYTES,
    MAX_PAGE,
    decode_cursor,
    encode_cursor,
)
from research_agent.errors import QueryError

#: The issue's goal for a default response: about 8k tokens, ~4 bytes a token.
DEFAULT_RESPONSE_BYTES = 32_000


def _write_docs(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc-{i:04d}.md").write_text(f"# Note {i}\n\nTopic number {i} about paging lists.\n")
    return folder


@pytest.fixture
def store_250(container, fake_embedder):
    """A real embedded store with one collection of 250 ingested documents (fake embedder: paging is logic)."""
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest import ingest_path

    create_collection(container, "paged")
    ingest_path(container, _write_docs(Path.cwd() / "many", 250), "paged", recursive=True)
    return container


def _all_pages(fetch, field: str, key: str, limit: int | None) -> tuple[list[str], list[int], int]:
    """Follow next_cursor to the end: every key seen, each page's size and the reported total."""
    seen: list[str] = []
    sizes: list[int] = []
    cursor = None
    for _ in range(100):
        page = fetch(limit=limit, cursor=cursor).model_dump(mode="json")
        seen += [item[key] for item in page[field]]
        sizes.append(len(page[field]))
        cursor = page["next_cursor"]
        if cursor is None:
            return seen, sizes, page["total"]
    raise AssertionError("paging never ended")


def test_document_pages_cover_every_document_exactly_once_in_key_order(store_250):
    from research_agent.ingest import list_documents

    def fetch(**kw):
        return list_documents(store_250, "paged", **kw)

    default = fetch().model_dump(mode="json")
    assert 0 < len(default["documents"]) <= DEFAULT_PAGE and default["total"] == 250 and default["next_cursor"]
    assert len(json.dumps(default["documents"], separators=(",", ":"), ensure_ascii=False)) <= DEFAULT_PAGE_BYTES + 100
    for limit in (None, 7, 250, MAX_PAGE):
        seen, sizes, total = _all_pages(fetch, "documents", "document", limit)
        assert total == 250
        assert len(seen) == 250 and len(set(seen)) == 250, limit
        assert seen == sorted(seen), "stable order: by document key"
        if limit:
            assert all(s == limit for s in sizes[:-1]) and 0 < sizes[-1] <= limit


def test_a_document_added_between_pages_repeats_and_skips_nothing(store_250):
    from research_agent.ingest import ingest_path, list_documents

    first = list_documents(store_250, "paged", limit=100)
    extra = _write_docs(Path.cwd() / "late", 0) / "aaa-first.md"
    extra.write_text("# Late\n\nAdded while an agent paged.\n")
    ingest_path(store_250, extra, "paged")
    rest = list_documents(store_250, "paged", cursor=first.next_cursor, limit=MAX_PAGE)
    keys = [d.document for d in first.documents] + [d.document for d in rest.documents]
    assert len(keys) == len(set(keys)) == 250, "the 250 old documents once each; the new one sorts before the cursor"
    assert rest.total == 251 and rest.next_cursor is None


@pytest.mark.parametrize("cursor", ["garbage!", "e30", encode_cursor("collections", "zzz"), "Zm9v" * 50])
def test_a_bad_cursor_is_a_query_error_with_guidance(store_250, cursor):
    from research_agent.ingest import list_documents

    with pytest.raises(QueryError) as err:
        list_documents(store_250, "paged", cursor=cursor)
    assert err.value.code == -32004 and "cursor" in err.value.message
    assert "next_cursor" in err.value.data["guidance"] and len(err.value.data["cursor"]) <= 80


@pytest.mark.parametrize("limit", [0, -1, MAX_PAGE + 1, True])
def test_a_limit_out_of_range_is_a_query_error(container, limit):
    from research_agent.catalog.projects import list_projects

    with pytest.raises(QueryError, match="limit"):
        list_projects(container, limit=limit)


def test_cursor_round_trip_is_opaque_and_bound_to_its_list():
    cursor = encode_cursor("documents:a", "x/ü.md")
    assert decode_cursor("documents:a", cursor) == "x/ü.md"
    assert "ü" not in cursor and "/" not in cursor
    with pytest.raises(QueryError, match="belongs to"):
        decode_cursor("documents:b", cursor)


def test_collection_and_project_pages_cover_all_once(container, fake_embedder):
    from research_agent.catalog.collections import create_collection, list_collections
    from research_agent.catalog.projects import create_project, link_collections, list_projects

    names = [f"col-{i:02d}" for i in range(23)]
    for name in names:
        create_collection(container, name, type="fundamental" if name.endswith(("0", "5")) else "project-specific")
    for i in range(12):
        create_project(container, f"proj-{i:02d}")
    link_collections(container, "proj-03", names[:9])

    seen, sizes, total = _all_pages(lambda **kw: list_collections(container, **kw), "collections", "name", 5)
    assert seen == names and total == 23 and sizes == [5, 5, 5, 5, 3]
    fundamentals = [n for n in names if n.endswith(("0", "5"))]
    seen, _, total = _all_pages(lambda **kw: list_collections(container, type="fundamental", **kw), "collections",
                                "name", 2)
    assert seen == fundamentals and total == len(fundamentals), "filters apply before paging"
    seen, _, total = _all_pages(lambda **kw: list_collections(container, project="proj-03", **kw), "collections",
                                "name", 4)
    assert seen == names[:9] and total == 9
    seen, sizes, total = _all_pages(lambda **kw: list_projects(container, **kw), "projects", "name", 5)
    assert seen == [f"proj-{i:02d}" for i in range(12)] and total == 12 and sizes == [5, 5, 2]
    last = list_projects(container)
    assert last.next_cursor is None and last.total == 12


# --- The Markdown text never cuts what the tool exists to return -------------------------------------------

LONG_PARAGRAPH = " ".join(f"Step {i}: the retry budget refills after a quiet period of {i} seconds." for i in range(24))


def _node_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "retries.md"
    path.write_text("# Retry policy\n- id: policy.retries\n- type: guideline\n- status: active\n<!-- content -->\n"
                    f"{LONG_PARAGRAPH}\n", encoding="utf-8")
    return path


def _strings(value, found: list[str]) -> list[str]:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, found)
    elif isinstance(value, list):
        for v in value:
            _strings(v, found)
    return found


def _cut_strings(structured: dict, text: str) -> list[str]:
    """Every string of the structured content the text lacks (table cells escape '|' and line breaks)."""
    flat = " ".join(text.split())
    return [s for s in _strings(structured, []) if s.strip() and " ".join(s.split()) not in flat
            and " ".join(s.replace("|", "\\|").split()) not in flat]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def mcp_no_warmup(monkeypatch):
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")


async def _text_and_data(client, tool: str, **arguments) -> tuple[str, dict]:
    result = await client.call_tool(tool, arguments)
    return "\n".join(c.text for c in result.content), result.structured_content


@pytest.mark.anyio
async def test_text_content_keeps_every_string_the_tool_returns(fake_embedder, mcp_no_warmup, monkeypatch):
    from fastmcp import Client

    from research_agent.mcp.server import create_server

    # A reranker that cannot load gives get_status a long error string to show.
    monkeypatch.setenv("RESEARCH_AGENT_RERANKER_MODEL", str(Path.cwd() / "no-such-reranker-model-folder" / ("x" * 90)))
    path = _node_file(Path.cwd() / "kb")
    async with Client(create_server()) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        await client.call_tool("ingest_documents", {"path": str(path), "collection": "kbase"})
        calls = {
            "retrieve_knowledge": {"ids": ["policy.retries"]},
            "manage_documents": {"action": "get", "collection": "kbase", "document": str(path)},
            "discover_context": {"task_description": "set the retry budget quiet period"},
            "get_status": {},
            "list_knowledge_bases": {},
        }
        for tool, arguments in calls.items():
            text, data = await _text_and_data(client, tool, **arguments)
            assert not _cut_strings(data, text), (tool, _cut_strings(data, text))
        text, data = await _text_and_data(client, "retrieve_knowledge", ids=["policy.retries"])
        assert LONG_PARAGRAPH in " ".join(text.split()) and len(LONG_PARAGRAPH) > 1000
        text, data = await _text_and_data(client, "search_knowledge", query="retry budget quiet period",
                                          search_type="keyword")
        assert data["results"] and all(" ".join(hit["content"].split()) in " ".join(text.split())
                                       for hit in data["results"])


@pytest.mark.anyio
async def test_created_collections_and_projects_keep_their_own_heading(fake_embedder, mcp_no_warmup):
    from fastmcp import Client

    from research_agent.mcp.server import create_server

    async with Client(create_server()) as client:
        text, data = await _text_and_data(client, "manage_collections", action="create", collection_name="fresh")
        assert data["name"] == "fresh" and data["projects"] == []
        assert text.startswith("## Manage collections") and "Projects (" not in text, text
        text, data = await _text_and_data(client, "manage_projects", action="create", project_name="proj")
        assert data["name"] == "proj" and data["collections"] == []
        assert text.startswith("## Manage projects") and "Collections (" not in text, text
        text, data = await _text_and_data(client, "manage_projects", action="list")
        assert text.startswith("## Projects (1)") and "proj" in text
        text, data = await _text_and_data(client, "manage_collections", action="list")
        assert text.startswith("## Collections (1)") and "fresh" in text


@pytest.mark.anyio
async def test_default_document_list_of_400_stays_near_8k_tokens(fake_embedder, mcp_no_warmup):
    """Issue 15: `manage_documents list` of 400 documents was 258 KB; a default page stays under ~32 KB in each of
    the structured content and the text, and says how to get the rest."""
    from fastmcp import Client

    from research_agent.mcp.server import create_server

    root = Path.cwd() / "projects" / "acme-platform" / "docs"
    for i in range(400):
        folder = root / f"area-{i % 12:02d}" / f"topic-{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"component-{i:03d}-reference-guide.md").write_text(
            f"---\ntitle: Component {i} reference guide\n---\n# Component {i}\n\nHow component {i} fails.\n")
    async with Client(create_server()) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "acme"})
        await client.call_tool("ingest_documents", {"path": str(root), "collection": "acme", "recursive": True})
        text, data = await _text_and_data(client, "manage_documents", action="list", collection="acme")
    assert data["total"] == 400 and data["next_cursor"] and 0 < len(data["documents"]) <= DEFAULT_PAGE
    assert len(json.dumps(data)) <= DEFAULT_RESPONSE_BYTES and len(text) <= DEFAULT_RESPONSE_BYTES
    assert text.startswith(f"## Documents ({len(data['documents'])} of 400)")


# --- Errors: the JSON-RPC code, and the guidance in the message, in the words of the face ------------------

PACKAGE = Path(__file__).resolve().parent.parent / "research_agent"


def _literal(node) -> str | None:
    """A string constant or an f-string with its placeholders kept as {…}; None for anything else."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)
    if isinstance(node, ast.BinOp):
        left, right = _literal(node.left), _literal(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _guidance_strings() -> list[tuple[str, str]]:
    """Every guidance text in the package: `guidance=` arguments, `default_guidance`, *ADVICE constants, and
    any string naming a `research-agent` command outside the CLI (which speaks to people only)."""
    import ast

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where.startswith(("cli/", "mcp/tools/")) or where == "guidance.py":
            continue  # the CLI speaks to people; tool descriptions name tools on purpose
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        parts |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings speak to us
        for node in ast.walk(tree):
            if id(node) in parts:
                continue  # a docstring, or a piece of an f-string (the whole f-string is checked)
            texts = []
            if isinstance(node, ast.keyword) and node.arg == "guidance":
                texts.append(_literal(node.value))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [getattr(t, "id", "") for t in targets]
                if any(n == "default_guidance" or "ADVICE" in n for n in names):
                    texts.append(_literal(node.value))
            texts += [s for s in [_literal(node)] if s and "`research-agent " in s and not isinstance(node, ast.BinOp)]
            found += [(where, t) for t in texts if t]
    return found


def test_every_guidance_string_has_a_translation_for_each_face():
    import re

    from research_agent.guidance import MCP_TOOLS, for_face

    strings = _guidance_strings()
    assert len(strings) >= 15, strings  # the scan finds the guidance it is meant to check
    tool_word = re.compile(r"\b(" + "|".join(MCP_TOOLS) + r")\b")
    commands = [(w, s) for w, s in strings if "`research-agent " in s]
    tools = [(w, s) for w, s in strings if tool_word.search(s)]
    assert commands and tools
    for where, text in commands:
        shown = for_face(text, "mcp")
        assert "research-agent " not in shown, (where, text, shown)
        assert tool_word.search(shown), (where, text, shown)
    for where, text in tools:
        shown = re.sub(r"\(MCP: [^()]*\)", "", for_face(text, "cli"))
        assert not tool_word.search(shown.replace("`research-agent", "")), (where, text, shown)
        assert "`research-agent " in shown, (where, text, shown)


@pytest.mark.parametrize(("cli", "mcp"), [
    ("Run `research-agent kb reindex --collection docs` first.",
     'Call `manage_documents(action="reindex", collection="docs")` first.'),
    ("Run `research-agent projects set-defaults web --collections a,b`.",
     'Call `manage_projects(action="set-defaults", project_name="web", collections="a,b")`.'),
    ("run `research-agent doctor --repair` (MCP: check_store with repair=true) now",
     "call `check_store(repair=true)` now"),
    ("Run `research-agent status` and check the log.", "Call `get_status()` and check the log."),
])
def test_for_face_translates_both_ways(cli, mcp):
    from research_agent.guidance import for_face

    assert for_face(cli, "mcp") == mcp
    assert for_face(mcp, "cli") == cli.replace(" (MCP: check_store with repair=true)", "")
    assert for_face(cli, "cli") == cli


@pytest.mark.anyio
async def test_errors_keep_their_code_and_carry_mcp_guidance_in_the_message(fake_embedder, mcp_no_warmup):
    from fastmcp import Client
    from mcp.shared.exceptions import MCPError

    from research_agent.mcp.server import create_server

    async with Client(create_server()) as client:
        for arguments, code in (({"action": "info", "collection_name": "missing-one"}, -32002),
                                ({"action": "info"}, -32602)):
            with pytest.raises(MCPError) as info:
                await client.call_tool("manage_collections", arguments)
            error = info.value
            guidance = error.data["guidance"]
            assert error.code == code and guidance and guidance in error.message, (error.message, error.data)
            assert "research-agent " not in error.message and "research-agent " not in guidance
        with pytest.raises(MCPError) as info:
            await client.call_tool("manage_collections", {"action": "info", "collection_name": "missing-one"})
        assert "manage_collections(action=\"list\")" in info.value.message


def test_the_model_free_check_takes_any_arguments_a_client_sends():
    """It runs before argument validation: an unhashable or missing action must not become a -32000."""
    from research_agent.mcp.lifespan import needs_models

    assert needs_models("manage_documents", {"action": []}) and needs_models("manage_documents", None)
    assert needs_models("manage_documents", {"action": "reindex"}) and needs_models("query_knowledge_base", {})
    assert not needs_models("manage_documents", {"action": "list"}) and not needs_models("get_status", None)
