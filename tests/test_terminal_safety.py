"""Stored text cannot drive the user's terminal (attack pass 2026-11-24): a catalog whose titles or content hold
escape sequences (`ESC[2J` clears the screen, `ESC]8;;URL` makes a disguised link, U+202E reverses text) wrote
them raw through `discover`, `retrieve`, `query` and `kb get`. People's output shows them as visible escapes;
`--json` keeps the stored text exactly (JSON escapes it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from research_agent.cli.main import app
from research_agent.cli.terminal import printable

runner = CliRunner()
HOSTILE = ("---\ntitle: paint \x1b[31mred\x1b[0m tool\n---\n# Paint \x1b]8;;http://evil.example\x07link\x1b]8;;\x07\n\n"
           "## paint_screen\n\nPaint the terminal screen red.\x1b[2J Then \u202eevil\u202c and a bell\x07.\n")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def cli(*args: str) -> str:
    result = runner.invoke(app, [str(a) for a in args], prog_name="research-agent")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_printable_shows_controls_visibly_and_keeps_text():
    assert printable("a\x1b[2Jb\tc\nd\u202ee") == "a\\x1b[2Jb\tc\nd\\u202ee"
    assert printable("plain ünïcode — 获取") == "plain ünïcode — 获取"


@pytest.mark.parametrize("command", [
    ("query", "paint the terminal screen red", "--collections", "ctl", "--no-rerank"),
    ("query", "paint the terminal screen red", "--collections", "ctl", "--no-rerank", "--explain"),
    ("discover", "paint the terminal screen red", "--collections", "ctl"),
    ("kb", "list-documents", "--collection", "ctl"),
    ("kb", "get", "paint.md", "--collection", "ctl"),
    ("kb", "get", "paint.md", "--collection", "ctl", "--lines", "1-12"),
], ids=["query", "explain", "discover", "list", "get", "get-lines"])
def test_no_control_character_reaches_the_terminal(fake_embedder, command):
    path = Path.cwd() / "paint.md"
    path.write_text(HOSTILE, encoding="utf-8")
    cli("collections", "create", "ctl", "--exist-ok")
    cli("kb", "add-document", path, "--collection", "ctl")
    out = cli(*command)
    assert not CONTROL.search(out.replace("\t", " ")), repr(out)
    if command[0] == "discover":
        node = json.loads(cli("--json", *command))["recommendations"][0]["id"]
        shown = cli("retrieve", node, "--collections", "ctl")
        assert not CONTROL.search(shown.replace("\t", " ")), repr(shown)
        assert "\\x1b[2J" in shown  # visible, not executed


def test_json_keeps_the_stored_text_exactly(fake_embedder):
    path = Path.cwd() / "paint.md"
    path.write_text(HOSTILE, encoding="utf-8")
    cli("collections", "create", "ctl")
    cli("kb", "add-document", path, "--collection", "ctl")
    hits = json.loads(cli("--json", "query", "paint the terminal screen red", "--collections", "ctl", "--no-rerank"))
    assert any("\x1b[2J" in h["content"] for h in hits["results"])
