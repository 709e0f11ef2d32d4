"""Query output for a record hit (issue 17): a record ingested with `kb add-records` shows its document key
(`tools.jsonl#search_web`), the handle `kb get` takes, not the file it came from (which names every record of
the file, so `kb get tools.jsonl` is an "ambiguous" error, and has no line for the record)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from research_agent.cli.main import app
from research_agent.cli.render import hit_location

runner = CliRunner()
TOOLS = [
    {"id": "search_web", "name": "Web search", "description": "Search the web for pages about a topic."},
    {"id": "send_mail", "name": "Send mail", "description": "Send an email message to a recipient."},
    {"id": "read_calendar", "name": "Calendar", "description": "List the events of a calendar day."},
]


def cli(*args: str):
    result = runner.invoke(app, [str(a) for a in args], prog_name="research-agent")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_a_record_hit_shows_the_key_kb_get_reads(fake_embedder):
    path = Path.cwd() / "tools.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TOOLS))
    cli("collections", "create", "tools")
    cli("kb", "add-records", path, "--collection", "tools", "--id-field", "id", "--text-field", "description",
        "--title-field", "name")
    hits = json.loads(cli("--json", "query", "send an email message", "--collections", "tools", "--no-rerank"))
    top = hits["results"][0]
    assert top["source_document"] == "tools.jsonl#send_mail" and top["path"] == str(path.resolve())
    text = cli("query", "send an email message", "--collections", "tools", "--no-rerank")
    first = next(line for line in text.splitlines() if line.startswith("1."))
    assert re.search(r"\btools\.jsonl#send_mail\b", first), first
    assert str(path) not in text and " tools.jsonl " not in first + " "
    # the handle works: `kb get` reads that one record
    got = json.loads(cli("--json", "kb", "get", "tools.jsonl#send_mail", "--collection", "tools"))
    assert got["document"] == "tools.jsonl#send_mail" and "email" in got["content"]


def test_files_keep_path_and_line_and_records_never_get_a_file_line():
    file_hit = SimpleNamespace(source_document="guide.md", line_start=42, page=None, metadata={"kind": "document"})
    assert hit_location(file_hit, "/w/docs/guide.md", cwd=Path("/w")) == "docs/guide.md:42"
    record = SimpleNamespace(source_document="tools.jsonl#send_mail", line_start=None, page=None,
                             metadata={"kind": "record"})
    assert hit_location(record, "/w/tools.jsonl", cwd=Path("/w")) == "tools.jsonl#send_mail"
