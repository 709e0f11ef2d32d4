"""Nothing leaks: path traversal, oversized inputs, sanitized errors, and a stdout that is only JSON-RPC.

Reads outside the allowed roots are counted with a Python audit hook on `open` (every file the server process
opens, whatever library opens it), not inferred from results.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CODED = {-32001, -32002, -32003, -32004}
SECRET = "secret-xyz"

_opened: list[str] = []
_watching: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _watching and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0]) if not isinstance(args[0], int) else ""
        if any(path.startswith(w) for w in _watching):
            _opened.append(path)


sys.addaudithook(_audit)


@pytest.fixture
def mcp(fake_embedder, monkeypatch):
    """An in-memory MCP client driven synchronously; allowed root = <cwd>/allowed."""
    from anyio.from_thread import start_blocking_portal
    from fastmcp import Client

    import mcp_server

    allowed = Path.cwd() / "allowed"
    allowed.mkdir()
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    monkeypatch.setenv("RESEARCH_AGENT_RERANK", "false")
    monkeypatch.setenv("RESEARCH_AGENT_API_KEYS", SECRET)
    monkeypatch.setenv("RESEARCH_AGENT_ALLOWED_ROOTS", str(allowed))
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(mcp_server.mcp)) as client:
            def call(name: str, **args: Any) -> Any:
                return portal.call(lambda: client.call_tool(name, args, raise_on_error=False))

            call("manage_collections", action="create", collection_name="sec")
            yield call, allowed


def error_of(call: Any, name: str, **args: Any) -> Any:
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError) as info:
        call(name, **args)
    err = info.value.error
    text = err.message + json.dumps(err.data or {})
    assert "Traceback" not in text and SECRET not in text and "site-packages" not in text, text
    return err


def outside_tree(base: Path) -> Path:
    outside = base / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.md").write_text("# Secret\n\noutsidesecrettoken lives here.\n", encoding="utf-8")
    (outside / "sub" / "deep.md").write_text("# Deep\n\noutsidesecrettoken deep.\n", encoding="utf-8")
    return outside


def test_path_traversal_through_mcp_ingest_reads_nothing_outside_the_roots(mcp, tmp_path):
    call, allowed = mcp
    outside = outside_tree(tmp_path)
    (allowed / "ok.md").write_text("# Fine\n\ninsidetoken text.\n", encoding="utf-8")
    (allowed / "link-file.md").symlink_to(outside / "secret.md")
    (allowed / "link-dir").symlink_to(outside, target_is_directory=True)
    nested = allowed / "nested"
    nested.mkdir()
    (nested / "up.md").symlink_to("../../outside/secret.md")

    attempts = [
        str(outside / "secret.md"), str(outside), "/etc/passwd", "/etc", "/",
        str(allowed / ".." / "outside" / "secret.md"), str(allowed / "../outside"),
        "../outside/secret.md", "allowed/../../outside/secret.md",
        str(allowed / "link-file.md"), str(allowed / "link-dir"), str(allowed / "link-dir" / "secret.md"),
        str(nested / "up.md"),
        "..\\..\\outside\\secret.md", "allowed\\..\\..\\outside\\secret.md", "..\\..\\etc\\passwd",
        "%2e%2e/outside/secret.md", "allowed/%2e%2e/%2e%2e/outside/secret.md", "..%2f..%2foutside%2fsecret.md",
        "%252e%252e/outside", "file://" + str(outside / "secret.md"),
        str(allowed / "ok.md") + "\x00/../../outside/secret.md", "allowed/ok.md\x00", "\x00",
        "~/" + str(outside.relative_to(Path.home())) if outside.is_relative_to(Path.home()) else "~/../../etc/passwd",
    ]
    _opened.clear()
    _watching[:] = [str(outside), "/etc/passwd"]
    try:
        for path in attempts:
            err = error_of(call, "ingest_documents", path=path, collection="sec", recursive=True)
            assert err.code == -32003, (path, err.code, err.message)
            assert str(tmp_path) not in err.message, (path, err.message)
        # The allowed folder itself ingests, skipping its symlinks that lead out.
        report = call("ingest_documents", path=str(allowed), collection="sec", recursive=True).structured_content
    finally:
        _watching.clear()
    assert _opened == [], f"files outside the roots were opened: {_opened}"
    assert report["documents"] == ["allowed/ok.md"], report
    docs = call("manage_documents", action="list", collection="sec").structured_content["documents"]
    assert [d["document"] for d in docs] == ["allowed/ok.md"]
    hits = call("query_knowledge_base", query="outsidesecrettoken", mode="keyword").structured_content["results"]
    assert hits == []


def test_path_with_a_component_over_255_bytes_is_a_document_error(mcp):
    call, allowed = mcp
    err = error_of(call, "ingest_documents", path=str(allowed / ("x" * 300)), collection="sec")
    assert err.code == -32003


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_growth(fn: Any) -> tuple[Any, float, float]:
    """Run fn(); return (its result or exception, peak RSS growth in MB while it ran, seconds)."""
    import threading

    base, peak, done = _rss_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        outcome: Any = fn()
    except Exception as exc:  # noqa: BLE001 - returned to the caller to inspect
        outcome = exc
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    return outcome, max(0.0, max(peak[0], _rss_mb()) - base), seconds


def sparse_gib(path: Path) -> Path:
    with open(path, "wb") as f:  # 1 GiB that takes no disk space
        f.seek(2**30)
        f.write(b"\0")
    return path


def test_oversized_query_and_collection_lists_are_refused_early_with_bounded_memory(mcp):
    from mcp.shared.exceptions import MCPError

    call, _ = mcp
    outcome, growth, seconds = peak_growth(lambda: call("query_knowledge_base", query="q" * 10_000_000))
    assert isinstance(outcome, MCPError) and outcome.error.code == -32004, outcome
    print(f"10 MB query: -32004 in {seconds:.2f} s, peak RSS growth {growth:.0f} MB")
    assert seconds < 5 and growth < 200



def test_a_list_of_100k_collections_is_refused_early_with_a_short_error(mcp):
    from mcp.shared.exceptions import MCPError

    call, _ = mcp
    many = [f"col-{i:06d}" for i in range(100_000)]
    outcome, growth, seconds = peak_growth(
        lambda: call("query_knowledge_base", query="smalltoken", collections=many, mode="keyword"))
    message = str(getattr(outcome, "error", outcome))
    print(f"100k collections: {message:.100} in {seconds:.2f} s, peak RSS growth {growth:.0f} MB, "
          f"message {len(message)} chars")
    assert isinstance(outcome, MCPError) and outcome.error.code in CODED | {-32602}, outcome
    assert "Traceback" not in outcome.error.message
    assert growth < 300
    assert seconds < 2 and len(message) < 5000


def test_a_1_gib_file_is_refused_without_being_read(mcp):
    from mcp.shared.exceptions import MCPError

    call, allowed = mcp
    sparse = sparse_gib(allowed / "huge.md")
    folder = allowed / "mixed"
    folder.mkdir()
    (folder / "huge.md").symlink_to(sparse)
    (folder / "small.md").write_text("# Small\n\nsmalltoken\n", encoding="utf-8")

    outcome, growth, seconds = peak_growth(lambda: call("ingest_documents", path=str(sparse), collection="sec"))
    assert isinstance(outcome, MCPError) and outcome.error.code == -32003 and "limit" in outcome.error.message
    print(f"1 GiB file: -32003 in {seconds:.2f} s, peak RSS growth {growth:.0f} MB")
    report, growth_folder, _ = peak_growth(lambda: call("ingest_documents", path=str(folder), collection="sec"))
    assert report.structured_content["documents"] == ["mixed/small.md"]
    assert [s["path"] for s in report.structured_content["skipped"]] == ["mixed/huge.md"]
    assert growth < 100 and growth_folder < 100 and seconds < 1, (growth, growth_folder, seconds)


def test_error_messages_are_sanitized(mcp, tmp_path):
    call, allowed = mcp
    store = str(tmp_path / "store")
    checks = [
        ("manage_collections", dict(action="info", collection_name="missing-col")),
        ("manage_collections", dict(action="create", collection_name="sec")),
        ("query_knowledge_base", dict(query=" ")),
        ("query_knowledge_base", dict(query="x", collections=["missing-col"])),
        ("ingest_documents", dict(path=str(allowed / "nope.md"), collection="sec")),
        ("ingest_documents", dict(path=str(allowed), collection="missing-col")),
        ("manage_documents", dict(action="remove", collection="sec", document="nope.md")),
        ("augment_knowledge", dict(content="", source="s", collection="sec")),
    ]
    (allowed / "bad.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    checks.append(("ingest_documents", dict(path=str(allowed / "bad.pdf"), collection="sec")))
    for name, args in checks:
        err = error_of(call, name, **args)
        assert err.code in CODED, (name, err.code, err.message)
        text = err.message + json.dumps(err.data or {})
        assert store not in text and "/usr/" not in text and ".venv" not in text, (name, text)
        assert err.data["guidance"], (name, err.data)
    status = call("get_status").structured_content
    assert SECRET not in json.dumps(status)


def test_cli_errors_never_show_secrets_or_tracebacks(fake_embedder, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from research_agent.cli.main import app

    monkeypatch.setenv("RESEARCH_AGENT_API_KEYS", SECRET)
    runner = CliRunner()
    for args in (["status"], ["--json", "status"], ["collections", "info", "nope"], ["query", " "],
                 ["kb", "add-document", "missing.md", "--collection", "nope"], ["-vv", "collections", "info", "nope"],
                 ["-vv", "--json", "status"]):
        result = runner.invoke(app, args)
        out = result.stdout + result.stderr
        assert SECRET not in out, (args, out)
        # -v/-vv ask for the log, tracebacks included; without them there is none.
        assert "-vv" in args or "Traceback" not in out, (args, out)


# -- stdio purity over a whole session -----------------------------------------------------------------
@pytest.mark.slow
def test_stdio_session_of_every_tool_with_real_model_is_pure_json_rpc(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_mcp_stdio import _mcp_env, _McpStdioSession

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("# Retries\n\nClients retry with exponential backoff.\n", encoding="utf-8")
    env = {**_mcp_env(tmp_path), "RESEARCH_AGENT_API_KEYS": SECRET, "RESEARCH_AGENT_WARMUP": "true"}
    s = _McpStdioSession(tmp_path, env)
    try:
        s.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "purity", "version": "0"}})
        s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools = {t["name"]: t for t in s.request(2, "tools/list")["result"]["tools"]}
        calls = [
            ("manage_collections", {"action": "create", "collection_name": "pure"}),
            ("manage_projects", {"action": "create", "project_name": "purep"}),
            ("manage_projects", {"action": "link", "project_name": "purep", "collections": ["pure"]}),
            ("ingest_documents", {"path": str(tmp_path / "notes"), "collection": "pure"}),  # loads the real model
            ("augment_knowledge", {"content": "# Found\n\nJitter spreads retries.", "source": "https://x.test",
                                   "collection": "pure"}),
            ("query_knowledge_base", {"query": "how do clients retry", "collections": ["pure"]}),
            ("manage_documents", {"action": "list", "collection": "pure"}),
            ("get_status", {}),
            ("manage_collections", {"action": "info", "collection_name": "does-not-exist"}),  # fails
            ("ingest_documents", {"path": "/etc/passwd", "collection": "pure"}),  # fails
        ]
        extra = {"discover_context": {"task_description": "add retries to the client"},
                 "retrieve_knowledge": {"ids": ["nope"]}, "search_knowledge": {"query": "retry"},
                 "list_knowledge_bases": {}, "get_dependencies": {"node_id": "nope"}, "check_store": {},
                 "evaluate_retrieval": {"collection": "sec", "queries_file": "nope.jsonl", "qrels_file": "nope.tsv"}}
        calls += [(name, args) for name, args in extra.items() if name in tools]
        covered = {name for name, _ in calls}
        outcomes = {}
        for n, (name, args) in enumerate(calls, start=10):
            reply = s.request(n, "tools/call", {"name": name, "arguments": args})
            outcomes[f"{n}:{name}"] = reply.get("error", {}).get("code", "ok")
            assert reply.get("error", {}).get("code", 0) != -32000, reply
        assert outcomes["18:manage_collections"] == -32002 and outcomes["19:ingest_documents"] == -32003, outcomes
        assert outcomes["13:ingest_documents"] == "ok" and outcomes["15:query_knowledge_base"] == "ok", outcomes
        uncovered = set(tools) - covered
        assert not uncovered, f"add these tools to the purity session: {uncovered}"
    finally:
        code = s.close()
    assert code == 0
    raw = b"".join(s.lines)
    assert raw, "no output"
    for line in raw.split(b"\n"):
        if line.strip():
            assert json.loads(line)["jsonrpc"] == "2.0", line[:200]
    assert SECRET.encode() not in raw
    assert "Traceback" not in s.stderr_path.read_text(errors="replace")
