"""Every guidance string in the package reads right on both faces: no CLI option, command, stdin or -v for an
MCP agent; no tool name or `name=value` tool argument for a person at a shell.

Regression (outside MCP tester, 02b7f3e): agents were told "Pass a smaller --top-k", "Pass --content TEXT,
--file F or text on stdin", "re-ingest files with kb add-document", "(or fix --chroma-host/--chroma-port) and run
the command again", "Re-run with -v for the log", "drop --strict"; CLI users "pass include_children=true".
The scan reads the sources (AST), so a new guidance string is checked the day it is written.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from research_agent.guidance import MCP_TOOLS, for_face

PACKAGE = Path(__file__).resolve().parents[1] / "research_agent"
TOOL = re.compile(r"\b(" + "|".join(MCP_TOOLS) + r")\b")
#: What an MCP agent cannot act on: a CLI option, a command, the shell's stdin, the CLI's -v, "the command".
CLI_WORDS = re.compile(r"(?<![\w-])--[a-z]|research-agent |\bkb [a-z]|\bstdin\b|(?<![\w-])-v\b|the command\b")
#: What a person at a shell cannot type: a tool argument with its value, `include_children=true`.
TOOL_ARGUMENT = re.compile(r"\b[a-z]+(?:_[a-z]+)*=(?:true|false|\d|\")")


def _literal(node: ast.AST) -> str | None:
    """A string constant, an f-string (placeholders as {x}) or a `+` of them; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _guidance(tree: ast.AST) -> list[str]:
    """`guidance=` arguments, `default_guidance` and *ADVICE / *GUIDANCE constants, and any other string that
    names a `research-agent` command (an advice built in pieces); not docstrings, not pieces of f-strings."""
    skip = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    skip |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.keyword) and node.arg == "guidance":
            found.append(_literal(node.value))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", "") == "default_guidance" or re.search(r"ADVICE|GUIDANCE", getattr(t, "id", ""))
                   for t in targets):
                found.append(_literal(node.value))
        elif isinstance(node, (ast.Constant, ast.JoinedStr)):
            text = _literal(node)
            if text and "`research-agent " in text:
                found.append(text)
    return [t for t in found if t]


def guidance_strings() -> list[tuple[str, str]]:
    """(module, text) for every guidance string outside the CLI (which speaks to people only) and this table."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where.startswith("cli/") or where == "guidance.py":
            continue
        out += [(where, t) for t in _guidance(ast.parse(path.read_text(encoding="utf-8")))]
    return out


def _outside_other_commands(text: str) -> str:
    """`text` without backticked command lines of other programs (`chroma run --path ...`, `qpdf ...`): an agent
    tells its user to run those; only our own commands must become tool calls."""
    return re.sub(r"`(?!research-agent )[^`(]*`", "", text)


STRINGS = guidance_strings()


def test_the_scan_finds_the_guidance_it_checks():
    assert len(STRINGS) >= 40, STRINGS
    assert sum("`research-agent " in t for _, t in STRINGS) >= 10
    assert sum(bool(re.search(r"(?<![\w`-])--[a-z]", t)) for _, t in STRINGS) >= 5  # options named in prose


@pytest.mark.parametrize(("where", "text"), STRINGS)
def test_guidance_has_no_cli_words_for_an_agent(where, text):
    shown = for_face(text, "mcp")
    assert not CLI_WORDS.search(_outside_other_commands(shown)), (where, text, shown)


@pytest.mark.parametrize(("where", "text"), [(w, t) for w, t in STRINGS if TOOL.search(t) or TOOL_ARGUMENT.search(t)])
def test_guidance_has_no_tool_words_for_a_person(where, text):
    shown = re.sub(r"\(MCP: [^()]*\)", "", for_face(text, "cli"))
    outside_commands = _outside_other_commands(re.sub(r"`research-agent [^`]*`", "", shown))
    assert not TOOL.search(outside_commands), (where, text, shown)
    assert not TOOL_ARGUMENT.search(outside_commands), (where, text, shown)


@pytest.mark.parametrize(("cli", "mcp"), [
    ("Pass a smaller --top-k.", "Pass a smaller `top_k`."),
    ("Pass --content TEXT, --file F or text on stdin.", "Pass `content`."),
    ("Only notes are updated in place; re-ingest files with kb add-document.",
     "Only notes are updated in place; re-ingest files with `ingest_documents()`."),
    ("(or fix --chroma-host/--chroma-port) and run the command again",
     "(or fix RESEARCH_AGENT_CHROMA_HOST/RESEARCH_AGENT_CHROMA_PORT) and call the tool again"),
    ("Re-run with -v for the log.", "Check the server's log (its stderr)."),
    ("Pass --collections a,b.", 'Pass `collections="a,b"`.'),
    ("Narrow the run with --include/--exclude.", "Narrow the run with `include`/`exclude`."),
    ("Fix the files, or drop --strict.", "Fix the files, or pass `strict=false`."),
    ("Pass e.g. --max-tokens 2000.", "Pass e.g. `max_tokens=2000`."),
    ("then without --dry-run, remove", "then with `dry_run=false`, remove"),
    ("(e.g. `qpdf --split-pages=500`)", "(e.g. `qpdf --split-pages=500`)"),
])
def test_prose_options_and_commands_become_tool_arguments(cli, mcp):
    assert for_face(cli, "mcp") == mcp


@pytest.mark.parametrize(("mcp", "cli"), [
    ("retrieve with include_children=true.", "retrieve with --include-children."),
    ("Fix the files, or pass `strict=false`.", "Fix the files, or drop --strict."),
    ("then with `dry_run=false`, remove", "then without --dry-run, remove"),
    ("Pass e.g. `max_tokens=2000`.", "Pass e.g. --max-tokens 2000."),
])
def test_prose_tool_arguments_become_options(mcp, cli):
    assert for_face(mcp, "cli") == cli
