"""What the stdio front (research_agent/mcp/stdio.py) answers before the server has loaded: a first
`initialize` (`initialize_result`), then tools/list, prompts/list, resources/list and resources/templates/list
exactly as the SDK writes them on the wire, per protocol version, from the snapshot in
research_agent/mcp/early_lists.py (generated: `python -m research_agent.mcp.early`; `--check` fails when stale).

Why: clients list tools right after `initialize`, and importing FastMCP and every tool's pydantic models takes
0.6-1.3 s quiet and 2-3 s on a loaded 2-core machine (benchmarks/handshake.py), so tools/list came 0.8-3.3 s
after spawn. The front answers these from the snapshot within milliseconds, then compares each with the SDK's
own answer to the replayed request: a stale snapshot is logged and followed by a list_changed notification,
and tests/test_mcp_startup.py fails until the snapshot is regenerated.

The snapshot comes from the real server through the SDK's own stdio writer (mcp.server.stdio), so the bytes
are the SDK's bytes; no tool runs, so no store opens and no model loads. Only the standard library is
imported at module level: the front imports this before anything heavy.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from research_agent import __version__

SERVER_NAME = "research-agent"
INSTRUCTIONS = """\
research-agent is a local knowledge base of collections of chunked documents (Markdown, code, PDFs, research
notes). Typical flow: manage_collections(action="list") to see what exists; query_knowledge_base to search;
ingest_documents to add files; augment_knowledge to save research you found. Errors are JSON-RPC errors with
data.type and data.guidance: -32602 invalid arguments, -32001 config, -32002 collection, -32003 document,
-32004 query, -32005 time limit exceeded."""

#: The protocol revisions the pinned SDK (mcp 2.3.0) negotiates through `initialize`, oldest first; a client
#: asking for another gets the newest (mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS).
HANDSHAKE_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
#: Where the generated snapshot lives (a Python module, so wheels carry it without package data).
SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "early_lists.py")
#: What the front answers early: the lists, and nothing that runs code or reads the store.
LIST_METHODS = ("tools/list", "prompts/list", "resources/list", "resources/templates/list")
REGENERATE = "python -m research_agent.mcp.early"
_WIDTH = 100  # characters of a result per line of the generated module (the house line limit is 120)
#: The notification that makes a client ask again, per list answered early (tools, prompts or resources).
LIST_CHANGED = {"tools/list": "notifications/tools/list_changed", "prompts/list": "notifications/prompts/list_changed",
                "resources/list": "notifications/resources/list_changed",
                "resources/templates/list": "notifications/resources/list_changed"}
#: What FastMCP 4.1.2 declares for this server (tools, resources and prompts registered; no subscriptions).
CAPABILITIES = {"logging": {}, "prompts": {"listChanged": True},
                "resources": {"subscribe": False, "listChanged": True}, "tools": {"listChanged": True}}


def initialize_result(params: Any) -> dict[str, Any] | None:
    """The SDK's result for these `initialize` params, or None unless they are plainly valid (then the SDK
    answers, with its own validation errors)."""
    if not isinstance(params, dict):
        return None
    version, client, capabilities = params.get("protocolVersion"), params.get("clientInfo"), params.get("capabilities")
    if not (isinstance(version, str) and isinstance(capabilities, dict)
            and all(isinstance(v, dict) for v in capabilities.values())
            and isinstance(client, dict) and isinstance(client.get("name"), str)
            and isinstance(client.get("version"), str)):
        return None
    return {"protocolVersion": version if version in HANDSHAKE_PROTOCOL_VERSIONS else HANDSHAKE_PROTOCOL_VERSIONS[-1],
            "capabilities": CAPABILITIES, "serverInfo": {"name": SERVER_NAME, "version": __version__},
            "instructions": INSTRUCTIONS}


_REQUEST_KEYS = {"jsonrpc", "id", "method", "params"}


def plain_list_request(message: dict[str, Any]) -> bool:
    """A list request the SDK would answer with the whole list: no cursor, and no params but a `_meta` holding at
    most a progress token (a 2026-era client's per-request `_meta` keys go to the SDK, which reads them)."""
    if message.get("method") not in LIST_METHODS:
        return False
    params = message.get("params", {})
    if not isinstance(params, dict) or not params.keys() <= {"_meta"}:
        return False
    meta = params.get("_meta", {})
    if not isinstance(meta, dict) or not meta.keys() <= {"progressToken"}:
        return False
    return type(meta.get("progressToken", "")) in (int, str)


def early_response(message: Any, first: bool, version: str | None,
                   lists: dict[str, dict[str, str]]) -> tuple[str, str | None] | None:
    """(the response line, the protocol version it settles) for a message the front can answer, else None.

    `first`: the session's first message (only that one may be an `initialize` answered here); `version`: the
    version an early `initialize` negotiated (None: lists wait for the server, which may refuse them).
    """
    if not (isinstance(message, dict) and message.get("jsonrpc") == "2.0"
            and type(message.get("id")) in (int, str) and message.keys() <= _REQUEST_KEYS):
        return None
    request_id = message["id"]
    if isinstance(request_id, str) and not request_id.isascii():
        try:
            request_id.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the SDK answers it (-32600)
            return None
    if first and message.get("method") == "initialize":
        result = initialize_result(message.get("params"))
        if result is None:
            return None
        response = {"jsonrpc": "2.0", "id": request_id, "result": result}
        return json.dumps(response, separators=(",", ":")), result["protocolVersion"]
    text = lists.get(version or "", {}).get(message.get("method")) if plain_list_request(message) else None
    if text is None:
        return None
    # The SDK's own layout around the stored result: its answer and ours are the same bytes.
    return '{"jsonrpc":"2.0","id":' + json.dumps(request_id, ensure_ascii=False) + ',"result":' + text + "}", version


def live_answers() -> dict[str, dict[str, str]]:
    """{protocol version: {method: result JSON text}} from a fresh server, as the SDK serializes it."""
    import tempfile
    from pathlib import Path

    import anyio

    with tempfile.TemporaryDirectory() as tmp:
        return {version: anyio.run(_answers, version, Path(tmp) / "store") for version in HANDSHAKE_PROTOCOL_VERSIONS}


def _requests(version: str) -> list[dict[str, Any]]:
    hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "early-lists", "version": "0"}}
    return [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            *({"jsonrpc": "2.0", "id": i, "method": m} for i, m in enumerate(LIST_METHODS, 1))]


async def _answers(version: str, store: Any) -> dict[str, str]:
    """One session over the SDK's stdio transport with in-memory streams; the store is a temporary path."""
    import anyio
    from mcp.server.stdio import stdio_server

    from research_agent.config import Settings
    from research_agent.mcp.server import create_server

    server = create_server(Settings(store=store, warmup=False))
    lines: dict[int, str] = {}
    answered = anyio.Event()

    async def client_lines() -> Any:
        for request in _requests(version):
            yield json.dumps(request) + "\n"
        await answered.wait()  # end of input ends the session: only after every answer was written

    class Capture:
        async def write(self, data: str) -> None:
            lines[json.loads(data)["id"]] = data.rstrip("\n")
            if len(lines) > len(LIST_METHODS):
                answered.set()

        async def flush(self) -> None:
            pass

    async with server._lifespan_manager(), stdio_server(client_lines(), Capture()) as (read, write):
        await server._mcp_server.run(read, write, server._mcp_server.create_initialization_options())
    return {method: _result_text(lines[i], i) for i, method in enumerate(LIST_METHODS, 1)}


def _result_text(line: str, request_id: int) -> str:
    """The result's own text out of the SDK's response line (the front puts each client's id around it)."""
    head, tail = f'{{"jsonrpc":"2.0","id":{request_id},"result":', "}"
    if not (line.startswith(head) and line.endswith(tail)):
        raise ValueError(f"unexpected SDK response layout: {line[:200]}")
    return line[len(head):-len(tail)]


def render(answers: dict[str, dict[str, str]]) -> str:
    """The generated module: each distinct result once (RESULTS), and which one answers what (ANSWERS)."""
    results: list[str] = []
    index = {v: {m: _intern(results, text) for m, text in by_method.items()} for v, by_method in answers.items()}
    out = ['"""Generated by `python -m research_agent.mcp.early` from the live server; do not edit.', "",
           "The SDK's wire answers to the lists a client asks for after `initialize` (research_agent/mcp/early.py).",
           '"""', "", "#: {protocol version: {method: index into RESULTS}}", "ANSWERS = {"]
    for version, by_method in index.items():
        out.append(f"    {version!r}: {{{', '.join(f'{m!r}: {i}' for m, i in by_method.items())}}},")
    out += ["}", "#: Each distinct result object, as compact JSON text exactly as the SDK writes it.", "RESULTS = ("]
    for text in results:
        out += [f"    {chunk!r}" for chunk in _chunks(text)]
        out[-1] += ","
    return "\n".join(out + [")", ""])


def _intern(results: list[str], text: str) -> int:
    if text not in results:
        results.append(text)
    return results.index(text)


def _chunks(text: str) -> list[str]:
    """Pieces whose repr fits a line (implicit concatenation joins them back); never empty."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + _WIDTH)
        while end - start > 1 and len(repr(text[start:end])) > _WIDTH + 4:
            end -= 1
        pieces.append(text[start:end])
        start = end
    return pieces or [""]


def stored_answers() -> dict[str, dict[str, str]] | None:
    """What the snapshot module holds, as live_answers() returns it; None if there is no snapshot."""
    try:
        from research_agent.mcp import early_lists
    except ImportError:
        return None
    results = early_lists.RESULTS
    return {v: {m: results[i] for m, i in by_method.items()} for v, by_method in early_lists.ANSWERS.items()}


def write() -> bool:
    """Regenerate the snapshot from the live server; True if it changed. The one call the contract tooling makes
    (scripts/gen_mcp_docs.py) next to the contract snapshot and docs/mcp.md."""
    text = render(live_answers())
    try:
        with open(SNAPSHOT, encoding="utf-8") as file:
            if file.read() == text:
                return False
    except FileNotFoundError:
        pass
    with open(SNAPSHOT, "w", encoding="utf-8") as file:
        file.write(text)
    return True


def main(argv: list[str]) -> int:
    if "--check" in argv:
        if stored_answers() != live_answers():
            print(f"{SNAPSHOT} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    print(f"{'wrote' if write() else 'unchanged:'} {SNAPSHOT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
