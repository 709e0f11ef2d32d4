"""Input the CLI did not expect (the outside tester's round on commit 02b7f3e): bytes that are not UTF-8 in argv
and stdin, `--exist-ok` that ignored what was asked, a folder typo that left an empty collection, and the small
things of the command line (`--json` on a group, `--json --version`, piped help width, limits as usage errors).

Process-level behaviour (argv bytes, stdin bytes, exit codes, stdout vs stderr) runs the installed entry point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from research_agent import __version__
from research_agent.cli.main import app

EXE = str(Path(sys.executable).with_name("research-agent"))
runner = CliRunner()


def run(*args: str | bytes | Path, input: bytes | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The real entry point with raw bytes allowed in argv and on stdin; stdout and stderr decoded leniently."""
    argv = [EXE, *(a if isinstance(a, bytes) else str(a) for a in args)]
    done = subprocess.run(argv, input=input, capture_output=True, timeout=timeout)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode("utf-8", "replace"),
                                       done.stderr.decode("utf-8", "replace"))


def ok_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, (result.returncode, result.stderr)
    return json.loads(result.stdout)


def error_json(result: subprocess.CompletedProcess, exit_code: int) -> dict:
    assert result.returncode == exit_code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    return json.loads(result.stderr.strip().splitlines()[-1])["error"]


def cli(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input, prog_name="research-agent")


# -- 1. bytes that are not UTF-8 --------------------------------------------------------------------------

@pytest.mark.slow
def test_non_utf8_argv_and_stdin_are_decoded_with_replacement_not_a_crash():
    ok_json(run("--json", "collections", "create", "cc1"))
    note = ok_json(run("--json", "kb", "add-note", "-", "--collection", "cc1", "--title", b"caf\xe9 retries",
                       input="The retry policy backs off exponentially, caf\xe9 style.".encode("latin-1")))
    assert note["title"] == "caf\ufffd retries" and note["chunks_written"] >= 1
    research = ok_json(run("--json", "kb", "add-research", "--collection", "cc1", "--source", b"http://x/\xff",
                           "--content", "Retry budgets cap the total retries."))
    assert research["source"] == "http://x/\ufffd"
    by_arg = ok_json(run("--json", "query", b"\xff retry", "--collections", "cc1", "--mode", "keyword",
                         "--no-rerank"))
    assert by_arg["query"] == "\ufffd retry" and by_arg["results"]
    by_stdin = ok_json(run("--json", "query", "-", "--collections", "cc1", "--mode", "keyword", "--no-rerank",
                           input=b"caf\xe9 retry"))
    assert by_stdin["query"] == "caf\ufffd retry" and by_stdin["results"]
    ok_json(run("--json", "discover", b"\xff fix the retry policy", "--collections", "cc1"))


def test_non_ascii_collection_name_is_a_collection_error_with_guidance():
    error = error_json(run("--json", "collections", "create", b"abc\xff"), 4)
    assert error["type"] == "CollectionError" and "letters, digits" in error["data"]["guidance"]
    error = error_json(run("--json", "collections", "create", "caf\u00e9s"), 4)
    assert error["type"] == "CollectionError"


def test_library_replaces_lone_surrogates_from_any_face(fake_embedder, container):
    """MCP JSON can carry "\\udcff" escapes: the library never hands a lone surrogate to a tokenizer or Chroma."""
    from research_agent.catalog.collections import create_collection, delete_collection
    from research_agent.catalog.notes import add_note, add_research
    from research_agent.errors import CollectionError
    from research_agent.search.service import query_knowledge

    with pytest.raises(CollectionError):
        create_collection(container, "abc\udcff")
    with pytest.raises(CollectionError):
        delete_collection(container, "abc\udcff")
    create_collection(container, "lib")
    note = add_note(container, "lib", "Retry policy caf\udce9 notes", "t\udcff", source="s\udcff")
    assert note.title == "t\ufffd" and note.source == "s\ufffd"
    research = add_research(container, "lib", "Backoff caf\udce9", "http://x/\udcff", title="r\udcff")
    assert research.source == "http://x/\ufffd" and research.title == "r\ufffd"
    result = query_knowledge(container, "\udcff retry", collections=["lib"], mode="keyword", rerank=False,
                             document_context="ctx \udcff")
    assert result.query == "\ufffd retry" and result.results


@pytest.mark.slow
def test_discovery_replaces_lone_surrogates_in_the_task(container):
    """discover_context's task reaches the real tokenizer too: a lone surrogate is replaced, not a TypeError."""
    from research_agent.catalog.collections import create_collection
    from research_agent.catalog.notes import add_note
    from research_agent.discovery.service import discover_context

    create_collection(container, "disc")
    add_note(container, "disc", "Retry policy: back off exponentially.", "Retry policy")
    result = discover_context(container, "fix the retry policy caf\udce9", collections=["disc"])
    assert result.recommendations and "\\udce9" not in result.model_dump_json()


def test_clean_text_replaces_only_lone_surrogates():
    from research_agent.text import clean_text

    assert clean_text("caf\udce9 \ud83d") == "caf\ufffd \ufffd"
    assert clean_text("café 😀 ok") == "café 😀 ok"


# -- 2. the query example and --context-file - --------------------------------------------------------------

def test_query_help_example_reads_the_diff_as_context_not_as_the_query():
    help_text = cli("query", "--help").stdout
    assert "git diff | research-agent query - " not in help_text
    assert "--context-file -" in help_text


def test_context_file_dash_reads_stdin():
    ok_json(run("--json", "collections", "create", "ctx1"))
    result = run("--json", "query", "why does the retry fail", "--collections", "ctx1", "--mode", "keyword",
                 "--no-rerank", "--context-file", "-", input=("diff --git a/x b/x\n+retry\n" * 200).encode())
    assert ok_json(result)["query"] == "why does the retry fail"


# -- 3. --exist-ok does what was asked, or says why not ----------------------------------------------------

def test_exist_ok_links_the_existing_collection_to_the_project():
    first = json.loads(cli("--json", "collections", "create", "shared", "--description", "Runbooks").stdout)
    assert first["created"] is True
    cli("--json", "projects", "create", "web")
    again = cli("--json", "collections", "create", "shared", "--project", "web", "--exist-ok")
    assert again.exit_code == 0, again.stderr
    body = json.loads(again.stdout)
    assert body["created"] is False and body["projects"] == ["web"]
    missing = cli("--json", "collections", "create", "shared", "--project", "nope", "--exist-ok")
    assert missing.exit_code == 4 and json.loads(missing.stderr)["error"]["type"] == "CollectionError"


def test_exist_ok_with_another_type_is_an_error_naming_both():
    cli("--json", "collections", "create", "typed", "--type", "fundamental")
    result = cli("--json", "collections", "create", "typed", "--type", "project-specific", "--exist-ok")
    assert result.exit_code == 4, result.stderr
    message = json.loads(result.stderr)["error"]["message"]
    assert "fundamental" in message and "project-specific" in message


def test_exist_ok_with_another_description_keeps_it_and_warns():
    cli("--json", "collections", "create", "described", "--description", "Runbooks")
    result = cli("collections", "create", "described", "--description", "Other", "--exist-ok")
    assert result.exit_code == 0, result.stderr
    assert "Runbooks" in result.stdout and "description" in result.stderr.lower()


def test_add_folder_type_without_create_is_a_usage_error(tmp_path):
    result = cli("kb", "add-folder", tmp_path, "--collection", "x1", "--type", "fundamental")
    assert result.exit_code == 2 and "--create" in result.stderr


# -- 4. a folder typo leaves nothing behind ----------------------------------------------------------------

def test_add_folder_create_on_a_missing_path_creates_nothing(tmp_path):
    result = cli("--json", "kb", "add-folder", tmp_path / "typo", "--collection", "new-c", "--create")
    assert result.exit_code == 5, result.stderr
    listed = json.loads(cli("--json", "collections", "list").stdout)
    assert [c["name"] for c in listed["collections"]] == []


# -- 5. the small things ---------------------------------------------------------------------------------

def test_json_group_without_command_is_one_json_error_and_empty_stdout():
    result = run("--json", "collections")
    error = error_json(result, 2)
    assert error["type"] == "InvalidParams" and error["message"]


def test_json_after_a_group_is_accepted():
    result = run("collections", "--json")
    error = error_json(result, 2)
    assert "No such option" not in error["message"] and error["message"]


def test_json_version_is_json():
    assert ok_json(run("--json", "--version")) == {"version": __version__}
    assert ok_json(run("--version", "--json")) == {"version": __version__}


def test_piped_help_does_not_wrap_at_80_columns():
    result = run("query", "--help")
    assert result.returncode == 0
    assert max(len(line) for line in result.stdout.splitlines()) > 80
    # The --filter help is one sentence of ~110 characters: piped, it stays on one line.
    assert any("...) is VALUE; a,b means any of them" in line and "Only chunks whose KEY" in line
               for line in result.stdout.splitlines())


def test_one_chunk_is_singular():
    from research_agent.cli import render

    assert render.plural(1, "chunk") == "1 chunk" and render.plural(2, "chunk") == "2 chunks"
    assert render.plural(0, "file") == "0 files"


@pytest.mark.parametrize("args", [
    ("collections", "list", "--limit", "5000"),
    ("collections", "list", "--limit", "0"),
    ("kb", "list-documents", "--collection", "c", "--limit", "5000"),
    ("projects", "list", "--limit", "5000"),
    ("query", "x", "--top-k", "0"),
    ("query", "x", "--max-tokens", "0"),
])
def test_out_of_range_numbers_are_usage_errors(args):
    result = cli("--json", *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert json.loads(result.stderr)["error"]["type"] == "InvalidParams"


def test_a_bad_cursor_stays_the_library_query_error():
    result = cli("--json", "collections", "list", "--cursor", "not-a-cursor")
    assert result.exit_code == 6 and json.loads(result.stderr)["error"]["type"] == "QueryError"


def test_decode_arg_keeps_the_bytes_of_an_existing_latin1_file_name(tmp_path):
    import os

    from research_agent.cli.inputs import decode_arg

    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.md")
    Path(name).write_text("x")
    assert decode_arg(name) == name  # still opens the file
    assert decode_arg(os.fsdecode(b"caf\xe9 retry")) == "caf\ufffd retry"
    assert decode_arg("caf\u00e9") == "caf\u00e9" and decode_arg("\ud83d x") == "\ufffd x"
