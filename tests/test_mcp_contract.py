"""The tool contract agents already know (issue 15): lists of names as "a,b" or an array, the seed's argument
names with their aliases, output schemas every result validates against, honest annotations, pageable lists
and a tools/list small enough to sit in every agent's context. Through a real in-memory fastmcp Client."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

import mcp_server

KNOWLEDGE = Path(__file__).parent / "fixtures" / "knowledge"
pytestmark = pytest.mark.anyio

#: Ceiling on what every agent carries in its context from tools/list: each tool's name, description and input
#: schema (16.5 KB before issue 15; 13,650 bytes with this round's features; 12,273 after issue 15's tightening,
#: which also added manage_collections exist_ok and ingest_documents create). Output schemas, annotations and
#: _meta are read by the client, not sent to the model (a tool definition for a model API has only name,
#: description and schema).
CONTEXT_MAX_BYTES = 12 * 1024
#: Ceiling on the whole tools/list result, output schemas included (top-level fields only, so they stay small).
#: 24 KB until issue 17 gave ingest_documents two more result shapes (web pages, records) and manage_documents
#: numbered lines: 26.5 KB, of which 13.7 KB reaches a model.
TOOLS_LIST_MAX_BYTES = 28 * 1024


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _no_warmup(no_warmup):
    """Every test here: no background model warm-up (conftest.no_warmup)."""


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def _two_collections(client: Client) -> None:
    for name in ("alpha", "beta"):
        await call(client, "manage_collections", action="create", collection_name=name)


async def test_collections_accept_a_comma_separated_string_or_an_array(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        await _two_collections(client)
        for tool, args in [("query_knowledge_base", {"query": "anything", "rerank": False}),
                           ("discover_context", {"task_description": "write the parser"}),
                           ("search_knowledge", {"query": "anything"})]:
            key = "scope" if tool == "search_knowledge" else "collections"
            for value in (" alpha , beta,", ["alpha", "beta"]):
                assert await call(client, tool, **args, **{key: value})
        await call(client, "manage_projects", action="create", project_name="shop")
        linked = await call(client, "manage_projects", action="link", project_name="shop", collections="alpha, beta")
        assert linked["collections"] == ["alpha", "beta"]
        answer = await call(client, "query_knowledge_base", query="anything", collections="alpha,beta", rerank=False)
        assert sorted(answer["collections"]) == ["alpha", "beta"]
        with pytest.raises(MCPError) as error:
            await client.call_tool("manage_projects", {"action": "unlink", "project_name": "shop",
                                                       "collections": " , "})
        assert error.value.code == -32602 and "collections" in str(error.value)


async def test_collection_lists_advertise_both_forms_in_the_schema():
    async with Client(mcp_server.mcp) as client:
        tools = {t.name: t.input_schema for t in await client.list_tools()}
    for tool, key in [("query_knowledge_base", "collections"), ("manage_projects", "collections"),
                      ("discover_context", "collections"), ("search_knowledge", "scope")]:
        kinds = {alt.get("type") for alt in tools[tool]["properties"][key]["anyOf"]}
        assert {"string", "array"} <= kinds, (tool, tools[tool]["properties"][key])


async def test_manage_projects_create_links_the_collections_it_is_given(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        await _two_collections(client)
        created = await call(client, "manage_projects", action="create", project_name="shop",
                             collections=["alpha", "beta"])
        assert created["collections"] == ["alpha", "beta"]
        assert (await call(client, "manage_projects", action="info", project_name="shop"))["collections"] == [
            "alpha", "beta"]
        with pytest.raises(MCPError) as error:  # a missing collection: nothing is created
            await client.call_tool("manage_projects", {"action": "create", "project_name": "cart",
                                                       "collections": "alpha,nope"})
        assert error.value.code == -32002
        names = [p["name"] for p in (await call(client, "manage_projects", action="list"))["projects"]]
        assert names == ["shop"]


async def test_the_seed_names_win_and_their_aliases_are_accepted(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        created = await call(client, "manage_collections", action="create", collection="alpha")
        assert created["name"] == "alpha"
        await call(client, "manage_collections", action="create", collection_name="beta")
        saved = await call(client, "augment_knowledge", collection_name="alpha", source="s",
                           content="# Retries\n\nThree retries with backoff.")
        assert saved["chunks_written"] >= 1
        listed = await call(client, "manage_documents", action="list", collection_name="alpha")
        assert len(listed["documents"]) == 1
        by_alias = await call(client, "query_knowledge_base", query="retries", scope="alpha", max_results=1,
                              rerank=False)
        by_name = await call(client, "query_knowledge_base", query="retries", collections="alpha", top_k=1,
                             rerank=False)
        assert by_alias["results"] == by_name["results"] and len(by_name["results"]) == 1
        hits = await call(client, "search_knowledge", query="retries", collections=["alpha"], top_k=1)
        assert len(hits["results"]) == 1
        tools = {t.name: t.input_schema for t in await client.list_tools()}
    # one name per argument in the schema: the seed's
    assert "collection_name" in tools["manage_collections"]["properties"]
    assert "collection" not in tools["manage_collections"]["properties"]
    assert {"top_k", "collections"} <= set(tools["query_knowledge_base"]["properties"])
    assert not {"max_results", "scope"} & set(tools["query_knowledge_base"]["properties"])
    assert {"max_results", "scope"} <= set(tools["search_knowledge"]["properties"])


async def test_read_only_tools_say_so_and_combined_tools_name_what_each_action_does():
    async with Client(mcp_server.mcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
    for name in ("query_knowledge_base", "discover_context", "retrieve_knowledge", "list_knowledge_bases",
                 "search_knowledge", "get_dependencies", "get_status", "evaluate_retrieval"):
        assert tools[name].annotations.read_only_hint is True, name
    combined = {"manage_collections": ("list, info", "delete"), "manage_projects": ("list, info", "delete"),
                "manage_documents": ("list, get", "remove")}
    for name, (reads, deletes) in combined.items():
        hints = tools[name].annotations
        assert hints.read_only_hint is False and hints.destructive_hint is True
        assert f"Read-only: {reads}." in tools[name].description, tools[name].description
        assert deletes in tools[name].description.split("Deletes: ")[1]


async def test_tools_list_stays_small_enough_for_an_agents_context():
    async with Client(mcp_server.mcp) as client:
        listed = await client.list_tools_mcp()
    wire = listed.model_dump(mode="json", by_alias=True, exclude_none=True)
    whole = len(json.dumps(wire, separators=(",", ":")).encode())
    context = len(json.dumps([{k: t[k] for k in ("name", "description", "inputSchema")} for t in wire["tools"]],
                             separators=(",", ":")).encode())
    assert context <= CONTEXT_MAX_BYTES, f"name + description + inputSchema of the tools: {context} bytes"
    assert whole <= TOOLS_LIST_MAX_BYTES, f"tools/list is {whole} bytes"


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every schema object inside `node` (properties, items, alternatives), `node` first."""
    found = [node] if isinstance(node, dict) else []
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return found + [n for child in children for n in _walk(child)]


async def test_lean_input_schemas_leave_out_only_what_validation_does_not_need(fake_embedder):
    """params.lean_input drops `null` alternatives (nested ones too), flags' `default: false` and
    `additionalProperties` (issue 15: 675 more bytes of every agent's context); the server validates exactly as
    before: null is still accepted where the argument is optional, an unknown argument is still a -32602 naming it."""
    async with Client(mcp_server.mcp) as client:
        tools = {t.name: t.input_schema for t in await client.list_tools()}
        nodes = [n for schema in tools.values() for n in _walk(schema)]
        assert not [n for n in nodes if n.get("type") == "null" or "additionalProperties" in n]
        assert not [n for n in nodes if n.get("type") == "boolean" and n.get("default") is False]
        assert tools["ingest_documents"]["properties"]["recursive"]["default"] is True  # a true default stays
        records = tools["ingest_documents"]["properties"]["records"]
        assert records["properties"]["title_field"] == {"type": "string"} and records["required"]
        page = await call(client, "manage_collections", action="list", project_name=None, limit=None,
                          exist_ok=False)
        assert page["collections"] == []
        with pytest.raises(MCPError) as error:
            await client.call_tool("manage_collections", {"action": "list", "colour": "red"})
        assert error.value.code == -32602 and "colour" in str(error.value)


async def _every_call(client: Client, folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """One call of every tool and every action that a fresh store with the knowledge fixtures can answer."""
    node = "guidelines.api.pagination"
    qrels = folder.parent / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\tknowledge/guidelines/api_design.md\t1\n")
    queries = folder.parent / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "pagination"}\n')
    return [
        ("manage_collections", {"action": "create", "collection_name": "knowledge"}),
        ("manage_collections", {"action": "create", "collection_name": "scratch"}),
        ("ingest_documents", {"path": str(folder), "collection": "knowledge"}),
        ("manage_collections", {"action": "list"}),
        ("manage_collections", {"action": "info", "collection_name": "knowledge"}),
        ("manage_projects", {"action": "create", "project_name": "shop", "collections": "knowledge"}),
        ("manage_projects", {"action": "link", "project_name": "shop", "collections": "scratch"}),
        ("manage_projects", {"action": "set-defaults", "project_name": "shop", "collections": "knowledge"}),
        ("manage_projects", {"action": "unlink", "project_name": "shop", "collections": "scratch"}),
        ("manage_projects", {"action": "list"}),
        ("manage_projects", {"action": "info", "project_name": "shop"}),
        ("query_knowledge_base", {"query": "pagination", "project": "shop", "rerank": False}),
        ("augment_knowledge", {"collection": "scratch", "source": "s", "content": "# Note\n\nSome text."}),
        ("manage_documents", {"action": "list", "collection": "scratch"}),
        ("manage_documents", {"action": "add-note", "collection": "scratch", "title": "N", "content": "x y"}),
        ("manage_documents", {"action": "prune", "collection": "knowledge", "dry_run": True}),
        ("manage_documents", {"action": "reindex", "collection": "scratch"}),
        ("discover_context", {"task_description": "add cursor pagination to the orders endpoint"}),
        ("retrieve_knowledge", {"ids": [node, "no-such-node"]}),
        ("list_knowledge_bases", {}),
        ("search_knowledge", {"query": "pagination"}),
        ("get_dependencies", {"node_id": "protocols.release.hotfix", "depth": 2}),
        ("evaluate_retrieval", {"collection": "knowledge", "queries_file": str(queries), "qrels_file": str(qrels)}),
        ("check_store", {}),
        ("get_status", {}),
        ("manage_projects", {"action": "delete", "project_name": "shop"}),
        ("manage_collections", {"action": "delete", "collection_name": "scratch"}),
    ]


async def test_every_tools_structured_content_validates_against_its_output_schema(fake_embedder):
    folder = Path.cwd() / "knowledge"
    shutil.copytree(KNOWLEDGE, folder)
    async with Client(mcp_server.mcp) as client:
        schemas = {t.name: t.output_schema for t in await client.list_tools()}
        called = set()
        for tool, arguments in await _every_call(client, folder):
            schema = schemas[tool]
            assert schema and schema.get("type") == "object" and (schema.get("properties") or schema.get("anyOf")), (
                f"{tool} declares no result shape: {schema}")
            jsonschema.Draft202012Validator.check_schema(schema)
            data = await call(client, tool, **arguments)
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=str)
            assert not errors, f"{tool}({json.dumps(arguments)}): {errors[0].message}"
            called.add(tool)
    assert called == set(schemas)


async def _all_pages(client: Client, tool: str, key: str, **arguments: Any) -> list[Any]:
    """Follow next_cursor with pages of one item; every page is a real tools/call."""
    items, cursor = [], None
    for _ in range(20):
        page = await call(client, tool, **arguments, limit=1, **({"cursor": cursor} if cursor else {}))
        assert len(page[key]) <= 1
        items += page[key]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError(f"{tool} never reached its last page")


async def test_list_tools_page_with_limit_and_cursor(fake_embedder):
    folder = Path.cwd() / "knowledge"
    shutil.copytree(KNOWLEDGE, folder)
    async with Client(mcp_server.mcp) as client:
        await _two_collections(client)
        for name in ("shop", "cart"):
            await call(client, "manage_projects", action="create", project_name=name)
        await call(client, "ingest_documents", path=str(folder / "guidelines"), collection="alpha")
        everything = await call(client, "manage_documents", action="list", collection="alpha")
        assert everything["total"] == 3 and everything["next_cursor"] is None
        assert [c["name"] for c in await _all_pages(client, "manage_collections", "collections", action="list")] == [
            "alpha", "beta"]
        assert [p["name"] for p in await _all_pages(client, "manage_projects", "projects", action="list")] == [
            "cart", "shop"]
        documents = await _all_pages(client, "manage_documents", "documents", action="list", collection="alpha")
        assert [d["document"] for d in documents] == [d["document"] for d in everything["documents"]]
        bases = await _all_pages(client, "list_knowledge_bases", "knowledge_bases")
        assert len(bases) == 3 and len({b["path"] for b in bases}) == 3
        with pytest.raises(MCPError) as error:
            await client.call_tool("manage_projects", {"action": "list", "cursor": "not-a-cursor"})
        assert error.value.code == -32004 and error.value.data["guidance"]
        with pytest.raises(MCPError) as error:
            await client.call_tool("manage_collections", {"action": "list", "limit": 100000})
        assert error.value.code == -32602


async def test_result_counts_declare_the_servers_maximum():
    """top_k, max_results and k say in their schemas what the server enforces (the max_top_k setting, 100 by
    default): the outside tester (02b7f3e) found no `maximum`, so an agent learnt the cap only from a failed call."""
    from research_agent.config import Settings

    cap = Settings().max_top_k
    async with Client(mcp_server.mcp) as client:
        tools = {t.name: t.input_schema for t in await client.list_tools()}
    for tool, key in [("query_knowledge_base", "top_k"), ("discover_context", "max_results"),
                      ("search_knowledge", "max_results"), ("evaluate_retrieval", "k")]:
        spec = tools[tool]["properties"][key]
        assert spec.get("minimum") == 1 and spec.get("maximum") == cap, (tool, spec)
    async with Client(mcp_server.mcp) as client:
        with pytest.raises(MCPError) as error:
            await client.call_tool("query_knowledge_base", {"query": "x", "top_k": cap + 1})
    assert str(cap) in str(error.value)
