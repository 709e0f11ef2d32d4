"""Guidance in the words of the face that shows it: a CLI command for people at a shell, an MCP tool call for
agents (issue 15: MCP clients were told to "Run `research-agent collections list`", CLI users to "Call
retrieve_knowledge").

Library code writes guidance once, naming the CLI command in backticks (`research-agent kb reindex --collection
x`) or an MCP tool; `for_face(text, "mcp")` turns the commands into tool calls (`manage_documents(action=
"reindex", collection="x")`) and `for_face(text, "cli")` turns tool names into commands. One table (EQUIVALENTS)
holds both directions. Standard library only: both faces and errors.py may import it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Callable, Literal

Face = Literal["cli", "mcp"]


@dataclass(frozen=True)
class Equivalent:
    """A CLI command and the MCP tool call that does the same (tests/test_parity.py pairs them too)."""

    command: str  # the words after `research-agent`
    tool: str
    action: str | None = None
    positional: str | None = None  # the tool argument the command's first positional argument fills
    options: dict[str, str] = field(default_factory=dict)  # CLI option -> tool argument, when they differ


EQUIVALENTS = (
    Equivalent("collections create", "manage_collections", "create", "collection_name",
               {"type": "collection_type", "project": "project_name"}),
    Equivalent("collections list", "manage_collections", "list", options={"type": "collection_type",
                                                                          "project": "project_name"}),
    Equivalent("collections info", "manage_collections", "info", "collection_name"),
    Equivalent("collections delete", "manage_collections", "delete", "collection_name"),
    Equivalent("export", "manage_collections", "export", "collection_name", {"output": "path"}),
    Equivalent("import", "manage_collections", "import", "path",
               {"collection": "collection_name", "on-conflict": "on_conflict"}),
    Equivalent("projects create", "manage_projects", "create", "project_name"),
    Equivalent("projects list", "manage_projects", "list"),
    Equivalent("projects info", "manage_projects", "info", "project_name"),
    Equivalent("projects delete", "manage_projects", "delete", "project_name"),
    Equivalent("projects link", "manage_projects", "link", "project_name"),
    Equivalent("projects unlink", "manage_projects", "unlink", "project_name"),
    Equivalent("projects set-defaults", "manage_projects", "set-defaults", "project_name"),
    Equivalent("kb add-document", "ingest_documents", None, "path"),
    Equivalent("kb add-folder", "ingest_documents", None, "path"),
    Equivalent("kb add-research", "augment_knowledge"),
    Equivalent("kb add-url", "ingest_documents", None, "path"),
    Equivalent("kb add-records", "ingest_documents", None, "path"),
    Equivalent("kb add-note", "manage_documents", "add-note"),
    Equivalent("kb update-note", "manage_documents", "update-note", "document"),
    Equivalent("kb get", "manage_documents", "get", "document"),
    Equivalent("kb list-documents", "manage_documents", "list"),
    Equivalent("kb remove-document", "manage_documents", "remove", "document"),
    Equivalent("kb reindex", "manage_documents", "reindex"),
    Equivalent("kb prune", "manage_documents", "prune"),
    Equivalent("query", "query_knowledge_base", None, "query", {"top-k": "top_k"}),
    Equivalent("discover", "discover_context", None, "task_description"),
    Equivalent("retrieve", "retrieve_knowledge", None, "ids"),
    Equivalent("dependencies", "get_dependencies", None, "node_id"),
    Equivalent("eval", "evaluate_retrieval"),
    Equivalent("doctor", "check_store"),
    Equivalent("status", "get_status"),
    # MCP-only views, named by the CLI command they view (tests/test_parity.py): for the CLI direction only.
    Equivalent("collections list", "list_knowledge_bases"),
    Equivalent("query", "search_knowledge"),
)

MCP_TOOLS = tuple(dict.fromkeys(e.tool for e in EQUIVALENTS))

#: CLI options named in prose ("Pass a smaller --top-k") -> the tool argument that does the same, both ways
#: (the outside tester, 02b7f3e: agents were told "--max-results", "--document-context", "drop --strict").
#: An option not listed is its name with "_" for "-"; the CLI direction turns only these arguments back.
FLAGS = {name: name.replace("-", "_") for name in (
    "top-k", "max-results", "k", "document-context", "content", "source", "title", "collections", "collection",
    "depth", "max-tokens", "include", "exclude", "strict", "dry-run", "include-children", "repair", "under",
    "prune", "recursive")}
#: Options that take no value: named alone they mean `name=true`.
SWITCHES = frozenset({"strict", "dry-run", "include-children", "repair", "prune", "recursive"})
#: Options of the process, not of a call: an agent's server reads them from its environment.
SETTING_FLAGS = {"chroma-host": "RESEARCH_AGENT_CHROMA_HOST", "chroma-port": "RESEARCH_AGENT_CHROMA_PORT",
                 "store": "RESEARCH_AGENT_STORE", "config": "RESEARCH_AGENT_CONFIG"}
#: CLI-only phrasings (stdin, -v, "the command") and what an agent does instead; before the options are turned.
MCP_PHRASES = (
    ("--content TEXT, --file F or text on stdin", "--content"),
    ("Re-run with -v for the log", "Check the server's log (its stderr)"),
    ("run the command again", "call the tool again"),
    ("Pass a writable --store PATH", "Set --store to a writable folder and restart the server"),
)
_CLI_CALL = re.compile(r"(?:\b([Rr]un) )?`research-agent ([^`]+)`")
_MCP_CALL = re.compile(r"(?:\b([Cc]all) )?(`?)\b(" + "|".join(MCP_TOOLS) + r")\b(?:\(([^()]*)\))?\2"
                       r"(?: with ([a-z_]+=[\w.,-]+))?")
_RUN_CALL = {"Run": "Call", "run": "call", "Call": "Run", "call": "run"}
#: "(MCP: check_store with repair=true)": a hint already written for agents, kept for people and dropped for
#: agents, who get the call itself.
_MCP_ASIDE = re.compile(r" ?\(MCP: [^()]*\)")
#: Backticked text (a command line, a tool call, `chroma run ...`): prose rules leave it alone.
_CODE = re.compile(r"(`[^`]*`)")
#: "--top-k", "drop --strict", "without --dry-run", "--depth 1", "--collections a,b", "--content TEXT".
_FLAG = re.compile(r"(?:\b(drop|without) )?--([a-z][a-z0-9-]*)"
                   r"(?: (\d+(?:\.\d+)?|[\w-]+(?:,[\w-]+)+|[A-Z]+)(?=[\s.,;:)]|$))?")
#: "kb add-document" named without `research-agent` and backticks.
_BARE_COMMAND = re.compile(r"\bkb [a-z]+(?:-[a-z]+)*\b")
#: "include_children=true", `dry_run=false`, top_k=5: a tool argument with its value, in prose.
_ARGUMENT = re.compile(r"(?:\b([Ww]ith|[Pp]ass) )?`?\b(" + "|".join(sorted(set(FLAGS.values()), key=len, reverse=True))
                       + r')=("[^"]*"|[\w-]+(?:[.,][\w-]+)*)`?')


def for_face(text: str, face: Face) -> str:
    """`text` with every CLI command turned into its MCP tool call (face "mcp") or every MCP tool into its CLI
    command (face "cli"); a verb "Run"/"Call" right before it follows along."""
    if not text:
        return text
    if face == "mcp":
        text = _CLI_CALL.sub(_as_tool_call, _MCP_ASIDE.sub("", text))
        return _in_prose(text, _prose_for_mcp)
    kept = _MCP_ASIDE.findall(text)
    parts = [_prose_for_cli(_MCP_CALL.sub(_as_command, part)) for part in _MCP_ASIDE.split(text)]
    return "".join(part + (kept[i] if i < len(kept) else "") for i, part in enumerate(parts))


def _in_prose(text: str, turn: Callable[[str], str]) -> str:
    """`text` with `turn` applied outside backticks (a command line or a tool call there is already right)."""
    return "".join(part if part.startswith("`") else turn(part) for part in _CODE.split(text))


def _prose_for_mcp(text: str) -> str:
    """CLI options and bare `kb ...` commands in prose as tool arguments and tool calls."""
    for cli, mcp in MCP_PHRASES:
        text = text.replace(cli, mcp)
    text = _BARE_COMMAND.sub(lambda m: f"`{tool_call(m.group(0)) or m.group(0)}`", text)
    return _FLAG.sub(_as_argument, text)


def _as_argument(m: re.Match[str]) -> str:
    """One `--option [value]` as the tool argument: `name`, `name=value`, or `name=false` after drop/without."""
    negation, option, value = m.groups()
    if option in SETTING_FLAGS:
        return (negation + " " if negation else "") + SETTING_FLAGS[option]
    name = FLAGS.get(option, option.replace("-", "_"))
    if negation:
        return f"{'pass' if negation == 'drop' else 'with'} `{name}=false`"
    if value and not value.isupper():
        return f"`{name}={_value(value)}`"
    return f"`{name}=true`" if option in SWITCHES else f"`{name}`"


def _prose_for_cli(text: str) -> str:
    """Tool arguments with values ("pass include_children=true", `dry_run=false`) as CLI options; tool calls
    are commands by now, so an argument left is one named in prose."""
    options = {arg: option for option, arg in FLAGS.items()}

    def option(m: re.Match[str]) -> str:
        verb, name, value = m.group(1), options[m.group(2)], m.group(3).strip('"')
        if value == "false":  # "pass `strict=false`" -> "drop --strict", "with `dry_run=false`" -> "without ..."
            return f"{'drop' if verb and verb.lower() == 'pass' else 'without'} --{name}"
        said = f"{verb} " if verb else ""
        return f"{said}--{name}" if value == "true" else f"{said}--{name} {shlex.quote(value)}"

    return _ARGUMENT.sub(option, text)


def with_guidance(message: str, guidance: str | None) -> str:
    """The message with the guidance after it, for clients that show only the message (issue 15): "Collection
    'x' not found. Call `manage_collections(action="list")` to see the collections that exist."."""
    guidance = (guidance or "").strip()
    message = message.rstrip()
    if not guidance or guidance in message:
        return message
    return f"{message}{'' if message.endswith(('.', '!', '?', ':')) else '.'} {guidance}"


def _words(command: str) -> tuple[Equivalent | None, list[str]]:
    """The table row a command line starts with (the longest match) and the words after it."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for size in (2, 1):
        head = " ".join(words[:size])
        for e in EQUIVALENTS:
            if e.command == head and e.tool not in ("list_knowledge_bases", "search_knowledge"):
                return e, words[size:]
    return None, words


def _arguments(e: Equivalent, rest: list[str]) -> list[tuple[str, str]]:
    """The tool arguments for a command's words: positional first, `--opt value` pairs, bare flags = true."""
    args: list[tuple[str, str]] = [("action", e.action)] if e.action else []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("--"):
            name = word[2:]
            has_value = i + 1 < len(rest) and not rest[i + 1].startswith("--")
            value = rest[i + 1] if has_value else "true"
            args.append((e.options.get(name, name.replace("-", "_")), value))
            i += 2 if has_value else 1
        else:
            if e.positional:
                args.append((e.positional, word))
            i += 1
    return args


def _value(value: str) -> str:
    return value if value in ("true", "false") or value.isdigit() else f'"{value}"'


def tool_call(command: str) -> str | None:
    """`research-agent` command words as the equivalent MCP tool call; None when no tool does it (serve)."""
    e, rest = _words(command)
    if e is None:
        return None
    return f"{e.tool}(" + ", ".join(f"{k}={_value(v)}" for k, v in _arguments(e, rest)) + ")"


def _as_tool_call(m: re.Match[str]) -> str:
    call = tool_call(m.group(2))
    if call is None:
        return m.group(0)
    verb = _RUN_CALL[m.group(1)] + " " if m.group(1) else ""
    return f"{verb}`{call}`"


def command(tool: str, arguments: str = "") -> str:
    """An MCP tool call (its name and `k=v, ...` arguments) as the equivalent `research-agent` command."""
    args = {k: quoted or bare for k, quoted, bare in re.findall(r'([a-z_]+)=(?:"([^"]*)"|([^,\s)]*))', arguments or "")}
    action = args.pop("action", None)
    rows = [e for e in EQUIVALENTS if e.tool == tool]
    e = next((r for r in rows if r.action == action), rows[0])
    if action is None and e.action is not None:  # manage_documents alone: the command group (`research-agent kb`)
        return "research-agent " + e.command.split()[0]
    words = [e.command]
    for name, value in args.items():
        if name == e.positional:
            words.insert(1, shlex.quote(value))
            continue
        option = next((o for o, a in e.options.items() if a == name), name.replace("_", "-"))
        words.append(f"--{option}" if value == "true" else f"--{option} {shlex.quote(value)}")
    return "research-agent " + " ".join(words)


def _as_command(m: re.Match[str]) -> str:
    verb, _, tool, arguments, extra = m.groups()
    arguments = ", ".join(a for a in (arguments, extra) if a)
    return (_RUN_CALL[verb] + " " if verb else "") + f"`{command(tool, arguments)}`"


__all__ = ["EQUIVALENTS", "MCP_TOOLS", "Equivalent", "command", "for_face", "tool_call", "with_guidance"]
