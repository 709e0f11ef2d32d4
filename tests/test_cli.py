"""The CLI through typer's CliRunner: --json shapes, exit codes, error JSON on stderr, confirmations, help."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from research_agent.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DOCS = Path(__file__).parent / "fixtures" / "docs"
HEAVY_MODULES = ("chromadb", "torch", "sentence_transformers", "transformers", "FlagEmbedding", "fastmcp", "bm25s")

runner = CliRunner()


def cli(*args: str, input: str | None = None, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input, env=env, prog_name="research-agent")


def cli_json(*args: str, input: str | None = None) -> dict:
    """Run with --json, require success, and return the parsed stdout (which must be one JSON object)."""
    result = cli("--json", *args, input=input)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def cli_error(exit_code: int, *args: str, input: str | None = None) -> dict:
    """Run with --json, require `exit_code`, an empty stdout and one error JSON line on stderr."""
    result = cli("--json", *args, input=input)
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    error = json.loads(lines[0])["error"]
    assert set(error) == {"code", "type", "message", "data"}
    assert error["data"]["type"] == error["type"] and error["data"]["guidance"]
    return error


def _all_command_paths():
    def walk(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, (*path, name))

    return list(walk(typer.main.get_command(app), ()))


# -- a store with the fixture docs ingested by the real embedding model (loaded once per process) ----

@pytest.fixture(scope="module")
def _cli_kb(tmp_path_factory):
    """A store holding collection `guides` with the fixture docs, ingested through the CLI; pass --store."""
    base = tmp_path_factory.mktemp("cli-kb")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("RESEARCH_AGENT_"):
                mp.delenv(key)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("XDG_CONFIG_HOME", str(base / "config"))
        mp.setenv("XDG_DATA_HOME", str(base / "data"))
        docs = base / "docs"
        shutil.copytree(FIXTURE_DOCS, docs)
        store = base / "store"
        assert cli("--store", store, "collections", "create", "guides").exit_code == 0
        result = cli("--json", "--store", store, "kb", "add-folder", docs, "--collection", "guides")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
    return {"store": store, "docs": docs, "report": report}


def test_ingest_folder_json_report(_cli_kb):
    report = _cli_kb["report"]
    assert report["collection"] == "guides"
    assert report["added"] >= 5 and report["failed"] == [] and report["chunks_written"] > 0
    assert set(report) >= {"added", "updated", "unchanged", "removed", "skipped", "failed", "chunks_written",
                           "files_seen", "seconds", "documents"}


def test_reingest_unchanged_folder_writes_nothing(_cli_kb):
    report = cli_json("--store", _cli_kb["store"], "kb", "add-folder", _cli_kb["docs"], "--collection", "guides")
    assert report["chunks_written"] == 0
    assert report["unchanged"] == _cli_kb["report"]["added"]


def test_query_json_returns_hits_with_header_path(_cli_kb):
    out = cli_json("--store", _cli_kb["store"], "query", "how do I install on Linux", "--collections", "guides",
                   "--top-k", "3")
    assert out["status"] == "success" and out["collections"] == ["guides"]
    assert 1 <= len(out["results"]) <= 3
    top = out["results"][0]
    assert set(top) >= {"content", "relevance_score", "relevance_label", "source_document", "header_path", "metadata"}
    assert top["source_document"].endswith("guide_install.md")
    assert "Install" in top["header_path"]
    assert out["query_refinement"]["status"] in {"optimal", "clarification_needed", "too_broad"}
    # Offline, the default cross-encoder cannot load: the query answers unreranked and says so.
    assert out["reranked"] is False and out["warnings"]


def test_query_human_output_shows_rank_source_header_and_warning(_cli_kb):
    result = cli("--store", _cli_kb["store"], "query", "install on Linux", "--mode", "semantic", "--top-k", "2")
    assert result.exit_code == 0, result.output
    assert "1." in result.stdout and "guide_install.md" in result.stdout and "Install" in result.stdout
    assert "Warning" in result.stderr and "Warning" not in result.stdout  # warnings never on stdout


def test_query_keyword_mode_no_rerank_with_context_file(_cli_kb, tmp_path):
    context = tmp_path / "ctx.md"
    context.write_text("I am writing the Linux installer section.", encoding="utf-8")
    out = cli_json("--store", _cli_kb["store"], "query", "install", "--mode", "keyword", "--no-rerank",
                   "--context-file", context)
    assert out["mode"] == "keyword" and out["results"]


def test_query_by_project_defaults(_cli_kb):
    store = _cli_kb["store"]
    cli_json("--store", store, "projects", "create", "handbook")
    cli_json("--store", store, "projects", "link", "handbook", "--collections", "guides")
    info = cli_json("--store", store, "projects", "set-defaults", "handbook", "--collections", "guides")
    assert info["default_collections"] == ["guides"]
    out = cli_json("--store", store, "query", "install", "--project", "handbook", "--top-k", "1")
    assert out["collections"] == ["guides"]


def test_list_documents_and_status(_cli_kb):
    docs = cli_json("--store", _cli_kb["store"], "kb", "list-documents", "--collection", "guides")
    assert docs["collection"] == "guides"
    assert {d["document"] for d in docs["documents"]} >= set(_cli_kb["report"]["documents"])
    status = cli_json("--store", _cli_kb["store"], "status")
    assert status["store_kind"] == "embedded" and status["store_location"] == str(_cli_kb["store"])
    assert status["collections"] >= 1 and status["chunks"] > 0


# -- commands on a fresh store per test (no embedding model needed unless ingesting) -----------------

def test_collections_lifecycle_json():
    info = cli_json("collections", "create", "notes", "--type", "fundamental", "--description", "my notes")
    assert info["name"] == "notes" and info["type"] == "fundamental" and info["description"] == "my notes"
    listed = cli_json("collections", "list", "--type", "fundamental")
    assert [c["name"] for c in listed["collections"]] == ["notes"]
    assert cli_json("collections", "list", "--type", "project-specific")["collections"] == []
    assert cli_json("collections", "info", "notes")["chunk_count"] == 0
    deleted = cli_json("collections", "delete", "notes", "--yes")
    assert deleted == {"deleted": "notes", "kind": "collection", "chunks_removed": 0}
    assert cli_json("collections", "list")["collections"] == []


def test_collections_create_in_project_and_list_by_project():
    cli_json("projects", "create", "proj-a", "--description", "A")
    cli_json("collections", "create", "api-docs", "--project", "proj-a")
    cli_json("collections", "create", "other")
    listed = cli_json("collections", "list", "--project", "proj-a")
    assert [c["name"] for c in listed["collections"]] == ["api-docs"]
    assert listed["collections"][0]["projects"] == ["proj-a"]


def test_projects_lifecycle_json():
    cli_json("collections", "create", "aaa")
    cli_json("collections", "create", "bbb")
    assert cli_json("projects", "create", "web", "--description", "site")["collections"] == []
    linked = cli_json("projects", "link", "web", "--collections", "aaa, bbb")
    assert sorted(linked["collections"]) == ["aaa", "bbb"]
    assert cli_json("projects", "set-defaults", "web", "--collections", "aaa")["default_collections"] == ["aaa"]
    assert cli_json("projects", "unlink", "web", "--collections", "bbb")["collections"] == ["aaa"]
    assert [p["name"] for p in cli_json("projects", "list")["projects"]] == ["web"]
    assert cli_json("projects", "info", "web")["description"] == "site"
    assert cli_json("projects", "delete", "web", "--yes")["kind"] == "project"
    assert cli_json("projects", "list") == {"projects": [], "total": 0, "next_cursor": None}


def test_human_output_for_lists_and_info():
    assert "No collections" in cli("collections", "list").stdout
    assert cli("collections", "create", "shown", "--description", "desc").exit_code == 0
    result = cli("collections", "list")
    assert result.exit_code == 0 and "shown" in result.stdout and "desc" in result.stdout
    assert "shown" in cli("collections", "info", "shown").stdout
    assert "No projects" in cli("projects", "list").stdout


def test_add_document_research_remove_and_reindex(tmp_path):
    cli_json("collections", "create", "work")
    page = tmp_path / "page.md"
    page.write_text("# Deploy\n\n## Rollback\n\nRun the rollback script to restore the previous release.\n",
                    encoding="utf-8")
    report = cli_json("kb", "add-document", page, "--collection", "work", "--title", "Deploy guide")
    assert report["added"] == 1 and report["chunks_written"] >= 1

    added = cli_json("kb", "add-research", "--collection", "work", "--source", "https://example.org/a",
                     "--content", "# Finding\n\nCanary releases catch regressions early.")
    assert added["status"] == "added" and added["chunks_written"] >= 1
    again = cli_json("kb", "add-research", "--collection", "work", "--source", "https://example.org/a",
                     "--content", "# Finding\n\nCanary releases catch regressions early.")
    assert again["status"] == "unchanged" and again["document"] == added["document"]
    from_stdin = cli_json("kb", "add-research", "-", "--collection", "work", "--source", "notes.txt",
                          "--title", "From stdin", input="Blue-green deployments swap traffic at once.\n")
    assert from_stdin["title"] == "From stdin"
    research_file = tmp_path / "research.md"
    research_file.write_text("Feature flags decouple deploy from release.", encoding="utf-8")
    from_file = cli_json("kb", "add-research", "--collection", "work", "--source", "book", "--file", research_file)
    assert from_file["status"] == "added"

    documents = {d["document"] for d in cli_json("kb", "list-documents", "--collection", "work")["documents"]}
    assert len(documents) == 4 and added["document"] in documents
    removed = cli_json("kb", "remove-document", added["document"], "--collection", "work")
    assert removed["kind"] == "document" and removed["chunks_removed"] >= 1

    reindexed = cli_json("kb", "reindex", "--collection", "work")
    assert reindexed["collection"] == "work" and reindexed["chunks_written"] >= 3
    assert cli_json("collections", "info", "work")["document_count"] == 3


def test_add_folder_options_prune_and_human_summary(tmp_path):
    cli_json("collections", "create", "folder")
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# A\n\nalpha text about apples\n", encoding="utf-8")
    (root / "b.txt").write_text("beta text about bananas\n", encoding="utf-8")
    (root / "sub" / "c.md").write_text("# C\n\ncherry text\n", encoding="utf-8")
    flat = cli_json("kb", "add-folder", root, "--collection", "folder", "--no-recursive", "--include", "*.md")
    assert flat["added"] == 1
    (root / "a.md").unlink()
    result = cli("kb", "add-folder", root, "--collection", "folder", "--exclude", "*.txt", "--prune")
    assert result.exit_code == 0, result.output
    assert "1 added" in result.stdout and "1 removed" in result.stdout
    names = [d["document"] for d in cli_json("kb", "list-documents", "--collection", "folder")["documents"]]
    assert len(names) == 1 and names[0].endswith("c.md")


def test_ingest_progress_bar_on_a_terminal(tmp_path):
    cli_json("collections", "create", "bar")
    (tmp_path / "x.md").write_text("# X\n\nsome words to index\n", encoding="utf-8")
    result = cli("kb", "add-folder", tmp_path, "--collection", "bar", env={"TTY_COMPATIBLE": "1"})
    assert result.exit_code == 0, result.output
    assert "1 added" in result.stdout
    assert "files" in result.stderr  # the rich progress bar, drawn on stderr


# -- errors and exit codes ----------------------------------------------------------------------------

def test_config_error_exit_3(tmp_path):
    error = cli_error(3, "--config", tmp_path / "missing.yaml", "status")
    assert error["code"] == -32001 and error["type"] == "ConfigError"
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_setting: 1\n", encoding="utf-8")
    assert "no_such_setting" in cli_error(3, "--config", bad, "collections", "list")["message"]


def test_collection_errors_exit_4():
    error = cli_error(4, "collections", "info", "nope")
    assert error["code"] == -32002 and error["type"] == "CollectionError"
    cli_error(4, "collections", "create", "x")  # invalid name
    cli_json("collections", "create", "dup")
    cli_error(4, "collections", "create", "dup")
    cli_error(4, "kb", "list-documents", "--collection", "missing")
    cli_error(4, "query", "anything", "--collections", "missing")


def test_document_errors_exit_5(tmp_path):
    cli_json("collections", "create", "docs")
    error = cli_error(5, "kb", "add-document", tmp_path / "missing.md", "--collection", "docs")
    assert error["code"] == -32003 and error["type"] == "DocumentError"
    cli_error(5, "kb", "add-research", "--collection", "docs", "--source", "s", "--file", tmp_path / "nope.md")
    cli_error(5, "kb", "add-research", "--collection", "docs", "--source", "s", "--content", "   ")
    cli_error(5, "kb", "remove-document", "not-there.md", "--collection", "docs")


def test_strict_folder_ingest_fails_with_exit_5(tmp_path):
    cli_json("collections", "create", "strict")
    (tmp_path / "ok.md").write_text("# Fine\n\ntext\n", encoding="utf-8")
    (tmp_path / "empty.md").write_text("", encoding="utf-8")
    assert cli_json("kb", "add-folder", tmp_path, "--collection", "strict")["skipped"]
    error = cli_error(5, "kb", "add-folder", tmp_path, "--collection", "strict", "--strict")
    assert error["data"]["report"]["skipped"]


def test_query_errors_exit_6():
    cli_json("collections", "create", "empty")
    error = cli_error(6, "query", "   ")
    assert error["code"] == -32004 and error["type"] == "QueryError"
    cli_error(6, "query", "ok", "--top-k", "5000")  # above settings.max_top_k; 0 is a usage error (exit 2)


def test_human_error_goes_to_stderr_with_guidance():
    result = cli("collections", "info", "nope")
    assert result.exit_code == 4 and result.stdout == ""
    assert "Error:" in result.stderr and "collections list" in result.stderr


def test_unexpected_error_is_sanitized_exit_1(monkeypatch):
    import research_agent.catalog.collections as service

    def boom(*args, **kwargs):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(service, "list_collections", boom)
    error = cli_error(1, "collections", "list")
    assert error["code"] == -32000 and "secret" not in json.dumps(error)
    quiet = cli("collections", "list")
    assert quiet.exit_code == 1 and "Traceback" not in quiet.stderr
    verbose = cli("-v", "collections", "list")
    assert verbose.exit_code == 1 and "Traceback" in verbose.stderr and "secret internal detail" in verbose.stderr


def test_keyboard_interrupt_exits_130_quietly(monkeypatch):
    import research_agent.catalog.collections as service

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(service, "list_collections", interrupted)
    result = cli("collections", "list")
    assert result.exit_code == 130 and result.stdout == ""


@pytest.mark.parametrize("args", [
    ["collections", "create"],                                          # missing NAME
    ["collections", "create", "abc", "--type", "weird"],               # not a choice
    ["query", "x", "--collections", "a", "--project", "p"],            # either, not both
    ["query", "x", "--document-context", "a", "--context-file", "f"],
    ["query", "x", "--mode", "fuzzy"],
    ["kb", "add-research", "--collection", "c", "--source", "s"],      # no content at all
    ["kb", "add-research", "--collection", "c", "--source", "s", "--content", "t", "-"],
    ["kb", "add-research", "oops", "--collection", "c", "--source", "s"],
    ["projects", "link", "p"],                                          # missing --collections
    ["no-such-command"],
])
def test_usage_errors_exit_2(args):
    result = cli("--json", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""


def test_add_document_on_a_folder_is_a_usage_error(tmp_path):
    assert cli("kb", "add-document", tmp_path, "--collection", "c").exit_code == 2


# -- confirmations ------------------------------------------------------------------------------------

def test_delete_refuses_without_yes_under_json_and_no_tty():
    cli_json("collections", "create", "keep")
    cli_json("projects", "create", "keep-p")
    for args in (["collections", "delete", "keep"], ["projects", "delete", "keep-p"]):
        result = cli("--json", *args)
        assert result.exit_code == 2 and result.stdout == "" and "--yes" in result.stderr
    assert cli_json("collections", "info", "keep")["name"] == "keep"
    assert cli_json("projects", "info", "keep-p")["name"] == "keep-p"


def test_delete_asks_for_confirmation_without_json():
    cli_json("collections", "create", "maybe")
    declined = cli("collections", "delete", "maybe", input="n\n")
    assert declined.exit_code == 1 and "Delete collection" in declined.stderr
    assert cli_json("collections", "info", "maybe")["name"] == "maybe"
    accepted = cli("collections", "delete", "maybe", input="y\n")
    assert accepted.exit_code == 0 and "Deleted collection" in accepted.stdout
    cli_error(4, "collections", "info", "maybe")


# -- serve, help, docs, startup cost --------------------------------------------------------------------

def test_serve_passes_global_options_to_mcp_server(monkeypatch, tmp_path):
    from research_agent.mcp import app as mcp_app

    calls = []
    monkeypatch.setattr(mcp_app, "run", lambda **kwargs: calls.append(kwargs))
    config = tmp_path / "c.yaml"
    result = cli("--store", tmp_path / "s", "--config", config, "-v", "serve", "--transport", "http", "--port", "9001")
    assert result.exit_code == 0, result.output
    assert calls == [{"transport": "http", "host": None, "port": 9001, "config_file": str(config),
                      "settings_overrides": {"store": str(tmp_path / "s"), "log_level": "INFO"}}]


@pytest.mark.parametrize("path", _all_command_paths(), ids=lambda p: " ".join(p) or "root")
def test_help_of_every_command(path):
    result = cli(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.stdout


def test_design_commands_are_listed():
    names = {" ".join(p) for p in _all_command_paths()}
    assert {"query", "status", "serve", "kb add-folder", "kb watch", "projects set-defaults", "doctor"} <= names


def test_docs_cli_md_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr + "\nRun: python scripts/gen_cli_docs.py"


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, time; t = time.perf_counter()\n"
            "from research_agent.cli.main import app\n"
            "try:\n    app(['--help'], prog_name='research-agent')\nexcept SystemExit:\n    pass\n"
            f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]\n"
            "print(heavy, time.perf_counter() - t, file=sys.stderr)\n"
            "assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_python_dash_m_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "research_agent", "--help"], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0 and "collections" in result.stdout


def test_query_filters_budget_and_snippets(_cli_kb):
    out = cli_json("--store", _cli_kb["store"], "query", "install", "--collections", "guides", "--no-rerank",
                   "--filter", "content_type=code_block,table", "--max-tokens", "40", "--snippets")
    assert out["results"] and all(h["metadata"]["content_type"] in ("code_block", "table") for h in out["results"])
    usage = cli("--store", _cli_kb["store"], "query", "install", "--filter", "content_type")
    assert usage.exit_code == 2 and "KEY=VALUE" in usage.stderr
    error = cli_error(6, "--store", _cli_kb["store"], "query", "install", "--filter", "colour=red")
    assert "colour" in error["message"]


def test_eval_reports_every_mode(_cli_kb, tmp_path):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\tdocs/guide_install.md\t1\n")
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "install on linux with apt"}\n')
    out = cli_json("--store", _cli_kb["store"], "eval", "--qrels", qrels, "--queries", queries,
                   "--collection", "guides", "--k", "5")
    modes = {m["mode"]: m for m in out["modes"]}
    assert set(modes) == {"semantic", "keyword", "hybrid", "hybrid+rerank"}
    assert modes["keyword"]["ndcg"] > 0 and modes["hybrid+rerank"]["available"] is False
    human = cli("--store", _cli_kb["store"], "eval", "--qrels", qrels, "--queries", queries, "--collection", "guides")
    assert human.exit_code == 0 and "unavailable" in human.stdout


def test_discover_retrieve_dependencies_commands(tmp_path):
    knowledge = Path(__file__).parent / "fixtures" / "knowledge"
    store = tmp_path / "kstore"
    assert cli("--store", store, "collections", "create", "knowledge").exit_code == 0
    assert cli("--store", store, "kb", "add-folder", knowledge, "--collection", "knowledge").exit_code == 0
    out = cli_json("--store", store, "discover", "Add cursor pagination to the orders list endpoint",
                   "--task-type", "implement")
    top = out["recommendations"][0]
    assert top["id"] == "guidelines.api.pagination" and top["reason"] and top["estimated_tokens"] > 0
    got = cli_json("--store", store, "retrieve", top["id"], "--format", "plain")
    assert got["nodes"][0]["id"] == top["id"]
    deps = cli_json("--store", store, "dependencies", "protocols.release.hotfix", "--direction", "upstream")
    assert deps["node"]["id"] == "protocols.release.hotfix"
    cli_error(5, "--store", store, "retrieve", "no-such-node")
    cli_error(6, "--store", store, "discover", "   ")
