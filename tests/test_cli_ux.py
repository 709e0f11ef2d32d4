"""The command line people expect (issue 15): flags where people type them, clean stdout, usable output.

Behaviour that depends on the process (stdout vs stderr, pipes, exit codes, stdin, signals) runs the installed
`research-agent` entry point in a subprocess; pure logic goes through CliRunner.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from research_agent import __version__
from research_agent.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
EXE = str(Path(sys.executable).with_name("research-agent"))
runner = CliRunner()


def cli(*args, input: str | None = None, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input, env=env, prog_name="research-agent")


def run(*args, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real entry point, stdout and stderr piped (the autouse fixture's env points it at a private store)."""
    return subprocess.run([EXE, *map(str, args)], input=input, capture_output=True, text=True, timeout=timeout)


def one_json(text: str) -> dict:
    """stdout must be exactly one JSON document (json.loads fails on anything before or after it)."""
    return json.loads(text)


def usage_error(result) -> dict:
    """A usage error under --json: exit 2, empty stdout, one JSON error line on stderr."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    error = json.loads(lines[0])["error"]
    assert error["code"] == -32602 and error["type"] == "InvalidParams"
    assert error["message"] and error["data"]["guidance"] and error["data"]["retryable"] is False
    return error


# -- 1. --json where people type it, --version, query from stdin ---------------------------------------

def test_json_after_the_subcommand_is_the_global_flag():
    created = run("collections", "create", "late-json", "--json")
    assert created.returncode == 0, created.stderr
    assert one_json(created.stdout)["name"] == "late-json"
    listed = run("collections", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert one_json(listed.stdout)["collections"][0]["name"] == "late-json"
    assert one_json(listed.stdout) == one_json(run("--json", "collections", "list").stdout)
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert one_json(status.stdout)["store_kind"] == "embedded"


def test_json_after_the_subcommand_also_formats_errors_as_json():
    result = cli("collections", "info", "nope", "--json")
    assert result.exit_code == 4 and result.stdout == ""
    assert json.loads(result.stderr)["error"]["type"] == "CollectionError"


def test_version():
    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"research-agent {__version__}"


def test_query_dash_reads_the_query_from_stdin(monkeypatch):
    import research_agent.search.service as service

    seen = []

    def fake_query(c, text, **kwargs):
        seen.append(text)
        raise service.QueryError("stop here", guidance="test")

    monkeypatch.setattr(service, "query_knowledge", fake_query)
    result = cli("--json", "query", "-", input="how do I roll back\n")
    assert result.exit_code == 6, result.output
    assert seen == ["how do I roll back"]


# -- 2. usage errors as JSON under --json; warnings never on stdout -----------------------------------------

@pytest.mark.parametrize("args", [
    ["--json", "collections", "create"],                  # missing argument
    ["--json", "collections", "list", "--bogus"],         # unknown option after the command
    ["--json", "--bogus", "status"],                      # unknown option before the command
    ["collections", "create", "abc", "--type", "weird", "--json"],  # --json after, bad choice
    ["--json", "no-such-command"],
])
def test_usage_errors_under_json_are_a_json_object(args):
    error = usage_error(run(*args))
    assert "--help" in error["data"]["guidance"]


def test_usage_error_without_json_keeps_the_human_message():
    result = run("collections", "create")
    assert result.returncode == 2 and result.stdout == ""
    assert "Missing argument" in result.stderr and not result.stderr.lstrip().startswith("{")


def test_query_warnings_go_to_stderr_not_stdout(monkeypatch):
    import research_agent.search.service as service

    def fake_query(c, text, **kwargs):
        return service.QueryResult(query=text, mode="hybrid", collections=["c"], reranked=False,
                                   warnings=["reranker unavailable: offline"], results=[],
                                   query_refinement={"status": "optimal", "suggestions": [], "message": "ok"},
                                   timings_ms={})

    monkeypatch.setattr(service, "query_knowledge", fake_query)
    result = cli("query", "anything")
    assert result.exit_code == 0, result.output
    assert "reranker unavailable" not in result.stdout
    assert "reranker unavailable" in result.stderr


@pytest.mark.slow
def test_json_stdout_is_one_document_while_the_store_heals_itself(tmp_path):
    """Real model, real store: a damaged saved keyword index is rebuilt (a log warning) and the reranker cannot
    load offline (a result warning); stdout still holds exactly one JSON document, warnings go to stderr."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "deploy.md").write_text("# Deploy\n\n## Rollback\n\nRun the rollback script to restore the previous "
                                    "release.\n", encoding="utf-8")
    assert run("collections", "create", "heal").returncode == 0
    assert run("--json", "kb", "add-folder", docs, "--collection", "heal").returncode == 0
    first = run("--json", "query", "rollback script", "--collections", "heal", timeout=300)
    assert first.returncode == 0, first.stderr
    saved = [p for p in (Path(os.environ["RESEARCH_AGENT_STORE"]) / "keyword-index").rglob("*") if p.is_file()]
    assert saved, "the keyword index was not saved"
    for path in saved:
        path.write_bytes(b"garbage")
    healed = run("--json", "query", "rollback script", "--collections", "heal", timeout=300)
    assert healed.returncode == 0, healed.stderr
    out = one_json(healed.stdout)
    assert out["results"] and out["warnings"]  # offline: answered unreranked, and says so
    logs = [json.loads(line)["log"] for line in healed.stderr.splitlines() if line.strip()]  # JSON lines too
    assert any("rebuilding" in entry["message"] and entry["level"] == "WARNING" for entry in logs), healed.stderr
    human = run("query", "rollback script", "--collections", "heal", timeout=300)
    assert human.returncode == 0 and "Warning" not in human.stdout and "Warning" in human.stderr


# -- 3. piped output is not wrapped at 80 columns; help has examples ------------------------------------

def test_piped_output_is_not_wrapped_at_80_columns():
    description = "a deliberately long description " * 6
    assert run("collections", "create", "wide", "--description", description.strip()).returncode == 0
    result = run("collections", "list")  # stdout is a pipe
    assert result.returncode == 0, result.stderr
    assert description.strip() in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 80


@pytest.mark.parametrize("command", [["query"], ["discover"], ["kb", "add-folder"], ["collections", "create"],
                                     ["collections", "list"], ["kb", "watch"]])
def test_help_of_main_commands_has_examples(command):
    result = cli(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Examples" in result.stdout and f"research-agent {' '.join(command)}" in result.stdout


# -- 4. create if missing: no `info || create` dance ------------------------------------------------------

def test_collections_create_exist_ok_returns_the_existing_collection():
    first = cli("--json", "collections", "create", "ci-docs", "--exist-ok", "--description", "first")
    assert first.exit_code == 0, first.output
    again = cli("--json", "collections", "create", "ci-docs", "--exist-ok", "--description", "second")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["description"] == "first"  # the existing one, unchanged
    assert cli("--json", "collections", "create", "ci-docs").exit_code == 4  # without the flag it stays an error
    assert cli("--json", "collections", "create", "x", "--exist-ok").exit_code == 4  # an invalid name too


def test_add_folder_create_makes_the_collection_if_missing(tmp_path, monkeypatch):
    import research_agent.ingest as ingest

    calls = []
    monkeypatch.setattr(ingest, "ingest_path",
                        lambda c, path, collection, **kw: calls.append(collection) or ingest.IngestReport(
                            collection=collection))
    folder = tmp_path / "notes"
    folder.mkdir()
    result = cli("--json", "kb", "add-folder", folder, "--collection", "made", "--create", "--type", "fundamental",
                 "--description", "made by CI")
    assert result.exit_code == 0, result.output
    info = json.loads(cli("--json", "collections", "info", "made").stdout)
    assert info["type"] == "fundamental" and info["description"] == "made by CI"
    assert cli("--json", "kb", "add-folder", folder, "--collection", "made", "--create").exit_code == 0
    assert calls == ["made", "made"]
    monkeypatch.undo()  # the real ingest: an unknown collection fails before any model loads
    missing = cli("--json", "kb", "add-folder", folder, "--collection", "other")
    assert missing.exit_code == 4 and "--create" in missing.stderr


# -- 5. the ingest progress bar --------------------------------------------------------------------------

def test_progress_bar_has_a_fixed_total_rate_and_eta():
    from research_agent.cli import render
    from research_agent.cli.state import CliState
    from research_agent.ingest import IngestProgress

    with render.ingest_progress(CliState(), force_terminal=True) as update:
        assert update is not None
        update(IngestProgress(stage="reading", files_done=0, files_total=4, chunks_done=0, chunks_total=0,
                              current="a.md"))
        update(IngestProgress(stage="writing", files_done=2, files_total=4, chunks_done=40, chunks_total=40))
        task = update.progress.tasks[0]
        assert task.total == 4 and task.completed == 2
        update(IngestProgress(stage="reading", files_done=3, files_total=4, chunks_done=40, chunks_total=60,
                              current="d.md"))
        assert task.completed == 2  # read is not done: the bar counts files whose chunks are written
        moved = []
        for embedded in (0, 32, 50):  # the last batch (files 3 and 4, 50 chunks) while it is embedded
            update(IngestProgress(stage="embedding", files_done=2, files_total=4, chunks_done=40 + embedded,
                                  chunks_total=90, files_progress=2 + 2 * embedded / 50))
            moved.append(task.completed)
            assert task.total == 4 and task.fields["chunks"] == f"embedding: {40 + embedded}/90 chunks"
        assert moved == [2, 2 + 2 * 32 / 50, 4]  # the bar moves while embedding, in files
        update(IngestProgress(stage="writing", files_done=4, files_total=4, chunks_done=90, chunks_total=90))
        assert task.total == 4 and task.completed == 4  # the total never moves
    columns = " ".join(type(c).__name__ for c in update.progress.columns)
    assert "TimeRemainingColumn" in columns and "RateColumn" in columns


def test_no_progress_bar_under_json_or_without_a_terminal(tmp_path):
    from research_agent.cli import render
    from research_agent.cli.state import CliState

    with render.ingest_progress(CliState(json=True), force_terminal=True) as update:
        assert update is None
    with render.ingest_progress(CliState(quiet=True), force_terminal=True) as update:
        assert update is None
    with render.ingest_progress(CliState()) as update:  # stderr is not a terminal under pytest
        assert update is None


# -- 6. watch says it watches; dependencies show titles ---------------------------------------------------

def test_watch_says_what_it_watches_and_how_to_stop(tmp_path):
    folder = tmp_path / "watched"
    folder.mkdir()
    assert run("collections", "create", "watched").returncode == 0
    proc = subprocess.Popen([EXE, "kb", "watch", folder, "--collection", "watched"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # bounded: a silent watch must fail, not hang (a selector, not select(): in a long run the pipe's fd
        # can be above select()'s FD_SETSIZE of 1024)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            ready = sel.select(60)
        line = proc.stderr.readline() if ready else ""
        assert "Watching" in line and str(folder) in line and "watched" in line and "Ctrl-C" in line
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped watching" in err


def test_dependencies_show_titles(monkeypatch):
    import research_agent.discovery as discovery
    from research_agent.discovery.models import DependencyEdge, DependencyGraph, DependencyNode

    def node(nid, title, distance):
        return DependencyNode(id=nid, collection="k", path=f"{nid}.md", title=title, type=None, status=None,
                              distance=distance)

    graph = DependencyGraph(node=node("a", "Release a hotfix", 0), direction="upstream", depth=1,
                            nodes=[node("a", "Release a hotfix", 0), node("b", "Freeze the branch", 1)],
                            edges=[DependencyEdge(source="a", target="b", kind="blocked_by")])
    monkeypatch.setattr(discovery, "get_dependencies", lambda c, node_id, **kw: graph)
    result = cli("dependencies", "a")
    assert result.exit_code == 0, result.output
    assert "Freeze the branch" in result.stdout and "Release a hotfix" in result.stdout



# -- 9. guidance in the CLI's words ----------------------------------------------------------------------

def test_error_guidance_names_cli_commands_not_mcp_tools(monkeypatch):
    import research_agent.catalog.collections as service
    from research_agent.errors import CollectionError

    def fails(*args, **kwargs):
        raise CollectionError("no such thing", guidance='Call manage_collections(action="list") to see them.')

    monkeypatch.setattr(service, "list_collections", fails)
    as_json = cli("--json", "collections", "list")
    assert as_json.exit_code == 4
    guidance = json.loads(as_json.stderr)["error"]["data"]["guidance"]
    assert "research-agent collections list" in guidance and "manage_collections" not in guidance
    human = cli("collections", "list")
    assert human.exit_code == 4
    assert "research-agent collections list" in human.stderr and "manage_collections" not in human.stderr


# -- 8. pagination ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("group", ["collections", "projects"])
def test_lists_page_with_limit_and_cursor(group):
    for name in ("aaa", "bbb", "ccc"):
        assert cli("--json", group, "create", name).exit_code == 0
    first = json.loads(cli("--json", group, "list", "--limit", "2").stdout)
    assert [x["name"] for x in first[group]] == ["aaa", "bbb"] and first["total"] == 3 and first["next_cursor"]
    second = json.loads(cli("--json", group, "list", "--limit", "2", "--cursor", first["next_cursor"]).stdout)
    assert [x["name"] for x in second[group]] == ["ccc"] and second["next_cursor"] is None
    human = cli(group, "list", "--limit", "2")
    assert human.exit_code == 0 and "ccc" not in human.stdout
    assert f"--cursor {first['next_cursor']}" in human.stdout and "2 of 3" in human.stdout
    assert "--cursor" not in cli(group, "list").stdout  # one page: no footer
    assert cli("--json", group, "list", "--cursor", "garbage").exit_code == 6


def test_list_documents_pages_with_limit_and_cursor(tmp_path):
    assert cli("--json", "collections", "create", "paged").exit_code == 0
    for name in ("a", "b", "c"):
        result = cli("--json", "kb", "add-research", "--collection", "paged", "--source", name, "--title", name,
                     "--content", f"# {name}\n\nnote {name}")
        assert result.exit_code == 0, result.output
    first = json.loads(cli("--json", "kb", "list-documents", "--collection", "paged", "--limit", "2").stdout)
    assert len(first["documents"]) == 2 and first["total"] == 3 and first["next_cursor"]
    rest = json.loads(cli("--json", "kb", "list-documents", "--collection", "paged", "--limit", "2",
                          "--cursor", first["next_cursor"]).stdout)
    assert len(rest["documents"]) == 1 and rest["next_cursor"] is None
    human = cli("kb", "list-documents", "--collection", "paged", "--limit", "2")
    assert f"--cursor {first['next_cursor']}" in human.stdout


def test_discover_max_results_zero_asks_for_a_positive_number():
    """0 was a QueryError whose guidance said "Pass a smaller --max-results"; now it is a usage error naming
    the range, like dependencies --depth."""
    result = run("--json", "discover", "write the release notes", "--max-results", "0")
    error = usage_error(result)
    assert "--max-results" in error["message"] and "greater than or equal to 1" in error["message"]
    assert "smaller" not in result.stderr


# -- 10. a reader that went away (`| head`) --------------------------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["query", "--help"], ["--json", "collections", "list"],
                                  ["collections", "list"], ["--version"]])
def test_closed_stdout_exits_quietly_with_141(args):
    """`research-agent query --help | head -1` printed "Unexpected failure (BrokenPipeError)" when head had
    gone before the write. Deterministic here: the pipe's read end is closed before the command starts, so its
    first write fails. Unix tools die of SIGPIPE there (status 128 + 13 = 141), saying nothing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([EXE, *args], stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err
    assert err == ""


# -- 11. the discovery message in the CLI's words ---------------------------------------------------------

def test_discover_message_names_cli_commands_not_mcp_tools(fake_embedder, docs_folder):
    """The library writes discover's message for agents ("Call retrieve_knowledge with the ids ...", "try
    search_knowledge ..."); people at a shell, and scripts reading --json, are told the CLI command instead."""
    from research_agent.guidance import MCP_TOOLS

    assert cli("collections", "create", "docs").exit_code == 0
    added = cli("kb", "add-folder", docs_folder, "--collection", "docs")
    assert added.exit_code == 0, added.output
    for task in ("install the package on linux", "zzqx unrelated gibberish task"):
        as_json = cli("--json", "discover", task, "--collections", "docs")
        assert as_json.exit_code == 0, as_json.output
        message = json.loads(as_json.stdout)["message"]
        human = cli("discover", task, "--collections", "docs")
        assert human.exit_code == 0, human.output
        for text in (message, human.stdout):
            assert "research-agent " in text, text
            assert not [tool for tool in MCP_TOOLS if tool in text], text
