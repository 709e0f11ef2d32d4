"""The server's surface as a client receives it: tools/list, resources/list, resources/templates/list,
prompts/list and the initialize answer's name, instructions and capabilities, as wire JSON.

tests/test_contract_snapshot.py freezes it (tests/fixtures/contract/) and scripts/gen_mcp_docs.py writes the
reference part of docs/mcp.md from it, so neither the contract nor its documentation can drift from the code.
"""

from __future__ import annotations

from typing import Any


def _wire(result: Any, key: str) -> list[dict[str, Any]]:
    """The list exactly as it travels in the JSON-RPC result (aliases, no nulls), in server order."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)[key]


async def live_surface() -> dict[str, Any]:
    """Every list a client can ask for, from a fresh server through an in-memory client.

    The legacy `initialize` handshake (what stdio clients send) so the initialize answer is part of it. No
    tool runs, so no store is opened and no model loads.
    """
    from fastmcp import Client

    from research_agent.mcp.server import create_server

    async with Client(create_server(), mode="legacy") as client:
        init = client.initialize_result
        return {
            "server": {"name": init.server_info.name, "instructions": init.instructions,
                       "capabilities": init.capabilities.model_dump(mode="json", by_alias=True, exclude_none=True)},
            "tools": _wire(await client.list_tools_mcp(), "tools"),
            "resources": _wire(await client.list_resources_mcp(), "resources"),
            "resource_templates": _wire(await client.list_resource_templates_mcp(), "resourceTemplates"),
            "prompts": _wire(await client.list_prompts_mcp(), "prompts"),
        }
