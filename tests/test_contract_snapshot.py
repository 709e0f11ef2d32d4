"""The MCP surface frozen: tools/list, resources/list, resources/templates/list, prompts/list and the server's
name and instructions, as a client receives them, compared with the JSON files in tests/fixtures/contract/.

Why: agents and client configs depend on tool names, argument schemas, annotations and descriptions; a
refactor (issue 13 split mcp_server.py into research_agent/mcp/) must not change one byte of them by accident.
A deliberate change regenerates the files and shows up in review as a diff of those files:

    UPDATE_CONTRACT=1 .venv/bin/python -m pytest tests/test_contract_snapshot.py -q -p no:cacheprovider

The error-code table (docs/mcp.md, "Errors") is checked here too: each error class reaches a client as its own
JSON-RPC code with `data.guidance`.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from research_agent import embeddings, errors
from research_agent.mcp.errors import (
    CALL_TIMEOUT,
    INVALID_PARAMS,
    ErrorMappingMiddleware,
    call_timeout,
    invalid_params,
    to_mcp_error,
)
from research_agent.mcp.surface import live_surface
from research_agent.storage.chunks import ChangedMeanwhile

SNAPSHOTS = Path(__file__).parent / "fixtures" / "contract"
UPDATE = os.environ.get("UPDATE_CONTRACT") == "1"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _no_warmup(no_warmup):
    """Every test here: no background model warm-up (conftest.no_warmup)."""


def _text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.anyio
@pytest.mark.parametrize("part", ["server", "tools", "resources", "resource_templates", "prompts"])
async def test_mcp_surface_matches_the_snapshot(part):
    live = _text((await live_surface())[part])
    path = SNAPSHOTS / f"{part}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(live, encoding="utf-8")
    assert path.exists(), f"{path} is missing; create it with UPDATE_CONTRACT=1 (see this file's docstring)"
    frozen = path.read_text(encoding="utf-8")
    if live != frozen:
        diff = "".join(difflib.unified_diff(frozen.splitlines(True), live.splitlines(True),
                                            f"snapshot {path.name}", "live server", n=2))
        pytest.fail(f"The MCP {part} changed:\n{diff}\nIf this is intended, regenerate with UPDATE_CONTRACT=1 "
                    "(tests/test_contract_snapshot.py docstring) and review the diff.", pytrace=False)


def test_docs_mcp_md_reference_is_current():
    """docs/mcp.md's tool, resource and prompt reference is generated from the live server, like docs/cli.md."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(root / "scripts" / "gen_mcp_docs.py"), "--check"],
                            capture_output=True, text=True, cwd=root, timeout=120)
    assert result.returncode == 0, result.stderr + "\nRun: python scripts/gen_mcp_docs.py"
    doc = (root / "docs" / "mcp.md").read_text(encoding="utf-8")
    assert all(f"### `{name}`" in doc for name in _snapshot_tool_names())


def _snapshot_tool_names() -> list[str]:
    return [t["name"] for t in json.loads((SNAPSHOTS / "tools.json").read_text(encoding="utf-8"))]


def test_snapshot_has_every_tool_once():
    tools = json.loads((SNAPSHOTS / "tools.json").read_text(encoding="utf-8"))
    names = _snapshot_tool_names()
    assert len(names) == len(set(names)) == 14
    assert all(t.get("outputSchema") and t.get("annotations") and t.get("description") for t in tools)


# -- the error-code table -------------------------------------------------------------------------------
ERROR_TABLE = [  # (class, JSON-RPC code, CLI exit code)
    (errors.ConfigError, -32001, 3),
    (errors.StoreUnavailableError, -32001, 3),
    (errors.CollectionError, -32002, 4),
    (errors.DocumentError, -32003, 5),
    (errors.QueryError, -32004, 6),
    (embeddings.HubUnreachableError, -32001, 3),
    (ChangedMeanwhile, -32001, 3),  # a scan lost its place to another machine's deletes: retryable
]


@pytest.mark.parametrize("cls,code,exit_code", ERROR_TABLE, ids=lambda v: getattr(v, "__name__", str(v)))
def test_each_error_class_maps_to_its_json_rpc_code_with_guidance(cls, code, exit_code):
    exc = cls("something is wrong", guidance="do this instead")
    mapped = to_mcp_error(exc, "tool x")
    assert (cls.code, cls.exit_code) == (code, exit_code)
    # the guidance rides in the message too, since some clients show only the message (DESIGN.md section 4)
    assert mapped.code == code and mapped.message.startswith("something is wrong")
    assert "do this instead" in mapped.message
    assert mapped.data["guidance"] == "do this instead" and mapped.data["type"] == cls.type_name


@pytest.mark.parametrize("cls", [c for c, *_ in ERROR_TABLE])
def test_guidance_exists_even_when_the_raiser_gave_none(cls):
    assert to_mcp_error(cls("bad")).data["guidance"]


def test_the_error_classes_are_all_in_the_table():
    """A new error class must get a row above (and a row in docs/mcp.md, "Errors"). Every module defining one
    is imported first, so the answer does not depend on which tests ran before."""
    import pkgutil

    import research_agent

    for mod in pkgutil.walk_packages(research_agent.__path__, "research_agent."):
        if "mcp_server" not in mod.name and not mod.name.endswith("__main__"):
            __import__(mod.name)
    def subclasses(cls: type) -> set[type]:
        return {s for c in cls.__subclasses__() for s in {c} | subclasses(c)}

    from research_agent.search.local_server import RemoteError  # carries a served error's own code and exit code

    assert subclasses(errors.ResearchAgentError) - {RemoteError} <= {c for c, *_ in ERROR_TABLE}


def test_unexpected_exceptions_become_a_sanitized_minus_32000():
    mapped = to_mcp_error(RuntimeError("secret path /home/x"), "tool y")
    assert mapped.code == -32000 and mapped.data["guidance"]
    assert "secret" not in json.dumps({"message": mapped.message, "data": mapped.data})


def test_server_side_codes_invalid_params_and_timeout():
    bad = invalid_params("collection_name is required", "Call again with collection_name set.")
    late = call_timeout("query_knowledge_base", 2.5)
    assert (INVALID_PARAMS, CALL_TIMEOUT) == (-32602, -32005)
    assert bad.code == -32602 and bad.data["guidance"] and bad.data["retryable"] is False
    assert late.code == -32005 and late.data["guidance"] and late.data["retryable"] is True
    assert isinstance(bad, MCPError) and ErrorMappingMiddleware  # the middleware is what the server installs


@pytest.mark.anyio
async def test_tool_groups_register_only_on_the_server_they_are_given():
    """No global server and no import side effects: a group's tools exist only where `register` put them."""
    from fastmcp import FastMCP

    from research_agent.mcp.server import TOOL_GROUPS
    from research_agent.mcp.tools import documents

    bare, with_documents = FastMCP("bare"), FastMCP("documents")
    documents.register(with_documents)
    assert await bare.list_tools() == []
    assert [t.name for t in await with_documents.list_tools()] == ["ingest_documents", "augment_knowledge",
                                                                    "manage_documents"]
    assert len(TOOL_GROUPS) == 6
