"""Citations an agent can act on (issue 17): hits cite `path:line`, `kb get` / `manage_documents get` read a
document or a line range with the file's line numbers, and bad ranges are coded errors.

Real parts: the packaged embedding model, embedded Chroma, the CLI in-process (CliRunner) and once as a real
subprocess. The fixture (tests/fixtures/citations/widget_guide.md) has front matter, fenced code with a double
blank line, a table and an indented code block.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from research_agent.cli.main import app

FIXTURES = Path(__file__).parent / "fixtures"
GUIDE = FIXTURES / "citations" / "widget_guide.md"
FRONT_MATTER_LINES = 5  # lines 1-5 of the fixture: `---` ... `---`
runner = CliRunner()


def cli(store: Path, *args: object):
    return runner.invoke(app, ["--store", str(store), *map(str, args)], prog_name="research-agent")


def cli_json(store: Path, *args: object) -> dict:
    result = cli(store, "--json", *args)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def cli_error(store: Path, *args: object) -> dict:
    """Exit 5 (DocumentError), nothing on stdout, one coded JSON error with guidance on stderr."""
    result = cli(store, "--json", *args)
    assert result.exit_code == 5, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    error = json.loads(result.stderr.strip())["error"]
    assert error["code"] == -32003 and error["data"]["guidance"], error
    return error


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """Collection `ops` holding the fixture (copied under the working dir) and a note, ingested with the real
    model into an embedded store; the working dir is the copy's parent so the CLI cites relative paths."""
    from conftest import isolated_container
    from research_agent.catalog.collections import create_collection
    from research_agent.catalog.notes import add_note
    from research_agent.ingest import ingest_path

    root = tmp_path_factory.mktemp("citations")
    work = root / "work"
    (work / "docs").mkdir(parents=True)
    path = work / "docs" / GUIDE.name
    shutil.copy(GUIDE, path)
    with isolated_container(root) as c:
        create_collection(c, "ops")
        report = ingest_path(c, path, "ops")
        assert report.added == 1 and not report.failed, report
        note = add_note(c, "ops", "# Parking\n\nUse level 2.\n\nBadges at the desk.", "Parking")
        c.close()
    return {"store": root / "store", "work": work, "path": path, "note": note.document}


@pytest.fixture
def in_kb(kb, monkeypatch):
    monkeypatch.chdir(kb["work"])
    return kb


def _printed_lines(stdout: str) -> dict[int, str]:
    """`kb get`'s numbered lines (`   42\\ttext`, `   42~\\ttext` when approximate) -> {42: text}."""
    out = {}
    for line in stdout.split("\n"):
        found = re.match(r"^ *(\d+)~?\t(.*)$", line)
        if found:
            out[int(found.group(1))] = found.group(2)
    return out


def test_kb_get_prints_the_files_own_line_numbers(in_kb):
    """Every line printed with a number is that line of the file (front matter, fences, table included)."""
    file_lines = in_kb["path"].read_text().split("\n")
    result = cli(in_kb["store"], "kb", "get", "docs/widget_guide.md", "--collection", "ops")
    assert result.exit_code == 0, result.output
    printed = _printed_lines(result.stdout)
    assert len(printed) > 40
    for n, text in printed.items():
        assert text == file_lines[n - 1], (n, text, file_lines[n - 1])
    # Every non-blank line after the front matter comes back; the front matter is said to be missing, not invented.
    body = {n for n in range(FRONT_MATTER_LINES + 1, len(file_lines) + 1) if file_lines[n - 1].strip()}
    assert body <= set(printed)
    assert not set(range(1, FRONT_MATTER_LINES + 1)) & set(printed)
    assert re.search(r"^ +1-6…$", result.stdout, re.M), result.stdout[:400]

    data = cli_json(in_kb["store"], "kb", "get", "docs/widget_guide.md", "--collection", "ops")
    assert data["line_basis"] == "source" and data["line_start"] == 1
    assert data["total_lines"] == max(body)
    assert data["missing"][0] == {"line_start": 1, "line_end": 6, "reason": data["missing"][0]["reason"]}
    exact = {line["n"]: line["text"] for line in data["lines"]}
    assert all(file_lines[n - 1] == text for n, text in exact.items())


def test_a_range_returns_exactly_those_lines_in_every_form(in_kb):
    """--lines 24-40, DOC:24-40 and line_start/line_end give lines 24..40 of the file, nothing else."""
    file_lines = in_kb["path"].read_text().split("\n")
    want = {n: file_lines[n - 1] for n in range(24, 41)}
    for args in (("docs/widget_guide.md", "--lines", "24-40"), ("docs/widget_guide.md:24-40",),
                 (str(in_kb["path"]) + ":24-40",)):
        data = cli_json(in_kb["store"], "kb", "get", *args, "--collection", "ops")
        got = {line["n"]: line["text"] for line in data["lines"]}
        blank = {s["line_start"] for s in data["missing"]}
        assert (data["line_start"], data["line_end"]) == (24, 40), args
        assert set(got) | blank == set(want) and all(want[n] == "" for n in blank), args
        assert all(got[n] == want[n] for n in got), args
        assert data["content"] == "\n".join(got[n] for n in sorted(got))
        result = cli(in_kb["store"], "kb", "get", *args, "--collection", "ops")
        assert set(_printed_lines(result.stdout)) == set(got)
    one = cli_json(in_kb["store"], "kb", "get", "docs/widget_guide.md:26", "--collection", "ops")
    assert [(line["n"], line["text"]) for line in one["lines"]] == [(26, file_lines[25])]
    clipped = cli_json(in_kb["store"], "kb", "get", "docs/widget_guide.md", "--lines", "50-9999", "--collection", "ops")
    assert (clipped["line_start"], clipped["line_end"]) == (50, clipped["total_lines"])
    assert any("ends at line" in note for note in clipped["notes"])


def test_bad_ranges_are_coded_errors_with_guidance(in_kb):
    store, doc = in_kb["store"], "docs/widget_guide.md"
    for lines in ("0", "0-5", "20-10", "abc", "1-x", "10--20", "9" * 60, ""):
        error = cli_error(store, "kb", "get", doc, "--lines", lines, "--collection", "ops")
        assert "N-M" in error["data"]["guidance"] or "reversed" in error["message"], (lines, error)
    error = cli_error(store, "kb", "get", doc, "--lines", "99999999999999999999-", "--collection", "ops")
    assert "past the end" in error["message"] and "1-" in error["data"]["guidance"]
    error = cli_error(store, "kb", "get", f"{doc}:20-10", "--collection", "ops")
    assert "reversed" in error["message"]
    error = cli_error(store, "kb", "get", f"{doc}:5", "--lines", "5", "--collection", "ops")
    assert "twice" in error["message"]
    error = cli_error(store, "kb", "get", "docs/nope.md:5", "--collection", "ops")
    assert "not found" in error["message"]


def test_a_note_is_numbered_by_its_stored_text(in_kb):
    data = cli_json(in_kb["store"], "kb", "get", in_kb["note"] + ":3", "--collection", "ops")
    assert [(line["n"], line["text"]) for line in data["lines"]] == [(3, "Use level 2.")]
    assert data["path"] is None and any("no file" in note for note in data["notes"])


@pytest.mark.anyio
async def test_manage_documents_get_reads_a_range_over_mcp(in_kb, monkeypatch):
    from fastmcp import Client
    from mcp.shared.exceptions import MCPError

    from research_agent.mcp.server import create_server

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    monkeypatch.setenv("RESEARCH_AGENT_STORE", str(in_kb["store"]))
    file_lines = in_kb["path"].read_text().split("\n")
    async with Client(create_server()) as client:
        got = await client.call_tool("manage_documents", {"action": "get", "collection": "ops",
                                                          "document": str(in_kb["path"]), "line_start": 12,
                                                          "line_end": 19})
        data = got.structured_content
        assert (data["line_start"], data["line_end"]) == (12, 19)
        assert {line["n"]: line["text"] for line in data["lines"]} == {
            n: file_lines[n - 1] for n in range(12, 20) if n not in (15,)}
        assert "pip install widget-service" in got.content[0].text
        for bad, code in (({"line_start": 0}, -32602), ({"line_start": 30, "line_end": 20}, -32003),
                          ({"line_start": 10_000}, -32003)):
            with pytest.raises(MCPError) as caught:
                await client.call_tool("manage_documents", {"action": "get", "collection": "ops",
                                                            "document": str(in_kb["path"]), **bad})
            assert caught.value.code == code and caught.value.data["guidance"], (bad, caught.value)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.slow
def test_query_output_cites_path_line_of_the_hits_text(in_kb):
    """A real `research-agent query` process prints `docs/widget_guide.md:N`, and line N of that file holds the
    first line of the hit's text. (Semantic mode: the citation does not depend on the retrieval mode.)"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RESEARCH_AGENT_STORE": str(in_kb["store"])}
    args = [sys.executable, "-m", "research_agent", "query", "retry budget before a job is parked",
            "--collections", "ops", "--top-k", "3", "--no-rerank", "--mode", "semantic"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=in_kb["work"], env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    cited = re.findall(r"(docs/widget_guide\.md):(\d+)", out.stdout)
    assert cited, out.stdout
    hits = json.loads(subprocess.run([*args[:3], "--json", *args[3:]], capture_output=True, text=True, timeout=300,
                                     cwd=in_kb["work"], env=env).stdout)["results"]
    file_lines = in_kb["path"].read_text().split("\n")
    assert [int(n) for _, n in cited] == [hit["metadata"]["line_start"] for hit in hits]
    # --json (and MCP) carry the citation as fields of the hit, not only in its metadata.
    assert all(hit["path"] == str(in_kb["path"].resolve()) for hit in hits), [hit["path"] for hit in hits]
    assert all((hit["line_start"], hit["line_end"]) == (hit["metadata"]["line_start"], hit["metadata"]["line_end"])
               for hit in hits)
    for (path, n), hit in zip(cited, hits):
        assert hit["content"].split("\n")[0].strip() in file_lines[int(n) - 1], (n, hit["content"][:80])


@pytest.mark.parametrize("max_tokens,overlap", [(40, 0), (80, 20), (350, 0)])
def test_no_line_is_given_as_exact_unless_it_is_the_files(max_tokens, overlap):
    """Over the real chunker on the Markdown fixtures (hybrid nodes, fences with headers inside, missing
    separators) at sizes that split tables, fences and long lines: every line read_lines gives without an
    `inexact` mark is the file's line, and front matter is never given."""
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.documents import read_lines
    from research_agent.ingest.parsing import parse_file

    files = [GUIDE, *sorted((FIXTURES / "docs").glob("*.md"))]
    split_tables = split_fences = 0
    for path in files:
        doc = parse_file(path)
        chunks = chunk_document(doc, source=path.name, max_tokens=max_tokens, overlap_tokens=overlap)
        file_lines = path.read_text().split("\n")
        got = read_lines([(ch.text, {"line_start": ch.line_start, "line_end": ch.line_end}) for ch in chunks])
        rough = got.estimated | got.joined | got.after_header
        wrong = {n: text for n, text in got.lines.items() if n not in rough and text != file_lines[n - 1]}
        assert not wrong, (path.name, wrong)
        assert not set(range(1, doc.first_line)) & (set(got.lines) - rough), path.name
        split_tables += sum(ch.text.startswith("|") and ch.line_start > 1 and file_lines[ch.line_start - 1] !=
                            ch.text.split("\n")[0] for ch in chunks)
        split_fences += sum(ch.text.startswith("```") and file_lines[ch.line_start - 1] != ch.text.split("\n")[0]
                            for ch in chunks)
    if max_tokens == 40:  # the small budget does split tables and fences, so their repeats were exercised
        assert split_tables and split_fences



@pytest.mark.parametrize("name", ["~nosuchuserx", "bad\x00name", "x" * 100_000, "~nosuchuserx/a.md:3"])
def test_get_bad_names_are_coded_not_found_errors(in_kb, name):
    """`~user` that is no user raised RuntimeError (expanduser), a NUL byte ValueError (resolve): both are
    names that match nothing; the message echoes at most 200 characters of the name (100k made a 100 KB error)."""
    error = cli_error(in_kb["store"], "kb", "get", name, "--collection", "ops")
    assert "not found" in error["message"] and len(error["message"]) < 300, error["message"][:300]


def test_a_negative_line_suffix_is_a_bad_range(in_kb):
    error = cli_error(in_kb["store"], "kb", "get", "docs/widget_guide.md:-1", "--collection", "ops")
    assert "not a line range" in error["message"] and "N-M" in error["data"]["guidance"]


WRAPPED = FIXTURES / "formats" / "hard_wrapped.md"  # paragraphs and list items hard-wrapped at 80 columns


@pytest.mark.parametrize("max_tokens,overlap", [(40, 0), (60, 10), (350, 0)])
def test_a_hard_wrapped_paragraph_split_across_chunks_reads_back_line_by_line(max_tokens, overlap):
    """A paragraph over the budget is split at sentences; every line of a chunk's range is then given, exactly
    the file's (or joined where two chunks share a line), none reported missing. Before, a split piece was one
    line, so `kb get DOC:47-59` on a hit citing lines 47-59 gave 47 and "not stored" for 48-59."""
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.documents import read_lines
    from research_agent.ingest.parsing import parse_file

    doc = parse_file(WRAPPED)
    chunks = chunk_document(doc, source=WRAPPED.name, max_tokens=max_tokens, overlap_tokens=overlap)
    file_lines = WRAPPED.read_text().split("\n")
    assert max(map(len, file_lines)) <= 82 and sum(len(ln) > 70 for ln in file_lines) > 50  # really hard-wrapped
    got = read_lines([(ch.text, {"line_start": ch.line_start, "line_end": ch.line_end}) for ch in chunks])
    wanted = {n for ch in chunks for n in range(ch.line_start, ch.line_end + 1) if file_lines[n - 1].strip()}
    assert wanted - set(got.lines) == set(), sorted(wanted - set(got.lines))[:20]
    wrong = {n: t for n, t in got.lines.items() if n not in got.joined and t != file_lines[n - 1]}
    assert not wrong, wrong
    assert not got.estimated
    for n in got.joined:  # a line two chunks share holds the file line's words, in order
        assert got.lines[n].split() == file_lines[n - 1].split(), (n, got.lines[n], file_lines[n - 1])
