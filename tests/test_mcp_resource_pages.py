"""Resource lists page with next_uri: a client reads every collection and every document by following it.

Regression (outside MCP tester, 02b7f3e): research://collections returned 33 of 40 collections and
research://collections/{name}/documents 90 of 131 documents (the page's 24 KB budget), with a next_cursor no
resource read could take. Through a real in-memory fastmcp Client on a real embedded Chroma store; the fake
embedder only embeds the tiny files (paging does not depend on vectors).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

import mcp_server

pytestmark = pytest.mark.anyio

#: The byte bound of one page: the catalog's 24 KB item budget plus the page's own fields, with room.
PAGE_MAX_BYTES = 40_000


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _no_warmup(no_warmup):
    """Every test here: no background model warm-up (conftest.no_warmup)."""


async def _read_all(client: Client, uri: str, key: str) -> tuple[list[dict[str, Any]], int]:
    """Every item of a paged resource list, following next_uri; and how many pages it took."""
    items, pages = [], 0
    while uri:
        text = (await client.read_resource(uri))[0].text
        assert len(text.encode()) <= PAGE_MAX_BYTES, (uri, len(text))
        page = json.loads(text)
        items += page[key]
        pages += 1
        assert pages <= 20, "next_uri does not advance"
        uri = page["next_uri"]
    return items, pages


async def test_every_collection_is_readable_through_next_uri(fake_embedder):
    names = [f"c{i:02d}-{'x' * 40}" for i in range(40)]
    async with Client(mcp_server.mcp) as client:
        for name in names:
            await client.call_tool("manage_collections", {"action": "create", "collection_name": name,
                                                          "description": "d" * 900})
        first = json.loads((await client.read_resource("research://collections"))[0].text)
        assert len(first["collections"]) < 40 and first["next_uri"]  # the budget cuts the first page
        listed, pages = await _read_all(client, "research://collections", "collections")
    assert sorted(c["name"] for c in listed) == names and pages >= 2


async def test_every_document_is_readable_through_next_uri(fake_embedder):
    folder = Path.cwd() / "docs"  # the server's allowed root is its working directory
    folder.mkdir()
    keys = [f"a-rather-long-folder-name/sub-{i % 7}/note-number-{i:03d}-{'p' * 30}.md" for i in range(131)]
    for key in keys:
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        (folder / key).write_text(f"# Note {key}\n\nSome text about topic {key}.\n", encoding="utf-8")
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "many"})
        await client.call_tool("ingest_documents", {"path": str(folder), "collection": "many"})
        listed, pages = await _read_all(client, "research://collections/many/documents", "documents")
    assert sorted(d["document"] for d in listed) == sorted(f"docs/{k}" for k in keys) and pages >= 2


async def test_every_knowledge_file_is_readable_through_next_uri(fake_embedder):
    """research://knowledge was one unbounded list (each entry names its node ids): ~700 KB on a 334-file
    store. It pages like the others now; following next_uri reads every file once."""
    folder = Path.cwd() / "kb"
    folder.mkdir()
    keys = [f"area-{i % 5}/topic-number-{i:03d}-{'q' * 30}.md" for i in range(120)]
    for key in keys:
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        sections = "".join(f"\n## Part {j} of {key}\n\nText {j}.\n" for j in range(6))
        (folder / key).write_text(f"# Topic {key}\n{sections}", encoding="utf-8")
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "knw"})
        await client.call_tool("ingest_documents", {"path": str(folder), "collection": "knw"})
        listed, pages = await _read_all(client, "research://knowledge", "resources")
    uris = [r["uri"] for r in listed]
    assert sorted(uris) == sorted(f"knowledge://knw/kb/{k}" for k in keys) and pages >= 2


async def test_listed_knowledge_uris_read_back_even_for_records_and_odd_names(fake_embedder):
    """Outside tester (A4): a records document (`recs.jsonl#r1`) was listed as knowledge://docs/recs.jsonl#r1,
    and reading that uri answered "No document 'recs.jsonl'": `#` starts a fragment. Listed uris are
    percent-escaped now, and each one reads back its own document."""
    folder = Path.cwd() / "odd"
    folder.mkdir()
    (folder / "what? a note #1.md").write_text("# Odd name\n\nA note with an odd file name.\n", encoding="utf-8")
    (folder / "recs.jsonl").write_text('{"id": "r1", "text": "Track a parcel."}\n', encoding="utf-8")
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "oddk"})
        await client.call_tool("ingest_documents", {"path": str(folder / "what? a note #1.md"),
                                                    "collection": "oddk"})
        await client.call_tool("ingest_documents", {"path": str(folder / "recs.jsonl"), "collection": "oddk",
                                                    "records": {"id_field": "id", "text_fields": ["text"]}})
        listed, _ = await _read_all(client, "research://knowledge", "resources")
        assert len(listed) == 2
        for entry in listed:
            text = (await client.read_resource(entry["uri"]))[0].text
            assert ("odd file name" in text) or ("Track a parcel" in text), (entry["uri"], text[:200])


async def test_resource_templates_offer_the_cursor():
    async with Client(mcp_server.mcp) as client:
        templates = {t.uriTemplate for t in await client.list_resource_templates()}
    assert {"research://collections{?cursor}", "research://collections/{name}/documents{?cursor}",
            "research://knowledge{?cursor}"} <= templates
