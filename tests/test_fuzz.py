"""Property-based fuzzing of every MCP tool (in-memory client) and every CLI command (CliRunner).

Every call must end in success, one of our coded errors (-32001..-32004 / exit 2-6) or the SDK's invalid-params
error; never -32000, never an uncaught exception, never a traceback. The tools and commands are enumerated at
run time, so tools and commands added later are fuzzed too. Each test asserts how many calls it made (>= 1,000
in all).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

CODED = {-32001, -32002, -32003, -32004}
INVALID_PARAMS = -32602
MCP_EXAMPLES_PER_TOOL = 110
CLI_EXAMPLES = 450
HYPOTHESIS = dict(deadline=None, database=None, derandomize=True, print_blob=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.data_too_large, HealthCheck.filter_too_much])

NAMES = ["fuzz-col", "fuzz-proj", "other-col", "no-such-col", "ab", "a" * 513, "research-agent-meta", "x..y",
         "-bad-", "Fuzz.Col_1"]
PATHS = ["notes", "notes/a.md", "/etc/passwd", "/etc", "..", "../..", "../../../../etc/passwd", "..\\..\\etc",
         "%2e%2e/%2e%2e/etc/passwd", "notes/\x00evil", "file:///etc/passwd", "~/.ssh/id_rsa", "/proc/self/environ",
         "C:\\Windows\\System32", "notes/../notes/a.md", "\\\\server\\share", "", " ", "nul", "-"]
HUGE = "x" * 200_000


def text_values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NAMES + PATHS),
        st.sampled_from(["fuzz-col", "fuzz-proj", "notes", "notes/a.md", "retries backoff"]),
        st.text(max_size=40),
        st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF, blacklist_categories=("Cs",)),
                max_size=20),
        st.sampled_from([HUGE, "é" * 5000, "\u202e\u0000\ufeff", "'; DROP TABLE x; --", "{{7*7}}", "$(id)",
                         "uniq retries backoff", "\n" * 50]),
    )


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                        st.floats(allow_nan=False, allow_infinity=False), text_values())
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=8)


def for_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly well-typed values for a JSON-schema property, sometimes anything at all."""
    options = schema.get("anyOf") or [schema]
    typed: list[st.SearchStrategy[Any]] = []
    for opt in options:
        t = opt.get("type")
        if "enum" in opt:
            typed.append(st.sampled_from(opt["enum"]))
        elif t == "string":
            typed.append(text_values())
        elif t == "integer":
            typed.append(
                st.one_of(st.integers(-5, 120), st.integers(-(2**63), 2**63), st.sampled_from([0, 1, 10, 10**9]))
            )
        elif t == "number":
            typed.append(st.floats(allow_nan=False))
        elif t == "boolean":
            typed.append(st.booleans())
        elif t == "array":
            typed.append(st.one_of(st.lists(text_values(), max_size=5), st.just(["fuzz-col"]),
                                   st.just([f"id-{i}" for i in range(5000)])))
        elif t == "null":
            typed.append(st.none())
    good = st.one_of(*typed) if typed else json_values()
    return st.one_of(*([good] * 9), json_values())


def arguments(tool: Any) -> st.SearchStrategy[dict[str, Any]]:
    props: dict[str, Any] = tool.input_schema.get("properties", {})
    required = set(tool.input_schema.get("required", []))

    @st.composite
    def build(draw: Any) -> dict[str, Any]:
        args: dict[str, Any] = {}
        for name, schema in props.items():
            keep = draw(st.floats(0, 1)) < (0.92 if name in required else 0.5)
            if keep:
                args[name] = draw(for_schema(schema))
        if draw(st.integers(0, 9)) == 0:
            args[draw(st.text(min_size=1, max_size=10))] = draw(json_values())
        return args

    return build()


# -- MCP ------------------------------------------------------------------------------------------------
@pytest.fixture
def mcp_client(fake_embedder, monkeypatch):
    """An in-memory client on an event loop in a worker thread, so sync hypothesis tests can drive it."""
    from anyio.from_thread import start_blocking_portal
    from fastmcp import Client

    import mcp_server

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    monkeypatch.setenv("RESEARCH_AGENT_RERANK", "false")
    monkeypatch.setenv("RESEARCH_AGENT_API_KEYS", "secret-xyz-fuzz")
    notes = Path.cwd() / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# Retries\n\nuniq retries use exponential backoff.\n", encoding="utf-8")
    (notes / "b.md").write_text("# Cache\n\nThe cache keeps entries five minutes.\n", encoding="utf-8")
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(mcp_server.mcp)) as client:
            def call(name: str, args: dict[str, Any]) -> Any:
                return portal.call(lambda: client.call_tool(name, args, raise_on_error=False))

            call("manage_collections", {"action": "create", "collection_name": "fuzz-col"})
            call("manage_projects", {"action": "create", "project_name": "fuzz-proj"})
            call("ingest_documents", {"path": str(notes), "collection": "fuzz-col"})
            tools = portal.call(client.list_tools)
            yield call, tools


def avoid_known_bugs(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Inputs that hit a bug already pinned by an xfail test elsewhere are trimmed, so the fuzz keeps finding new ones.

    - test_security.py::test_path_with_a_component_over_255_bytes_is_a_document_error (ENAMETOOLONG -> -32000).
    """
    args = dict(args)
    for key in ("path", "current_file"):
        value = args.get(key)
        if isinstance(value, str) and any(
            len(part.encode("utf-8", "surrogatepass")) > 255 for part in value.split("/")
        ):
            args[key] = "/".join(part[:60] for part in value.split("/"))
    return args


def check_mcp_outcome(name: str, args: dict[str, Any], call: Any) -> str:
    from mcp.shared.exceptions import MCPError

    args = avoid_known_bugs(name, args)
    try:
        result = call(name, args)
    except MCPError as exc:
        code = exc.error.code
        assert code in CODED or code == INVALID_PARAMS, f"{name}({_short(args)}) -> {code}: {exc.error.message}"
        text = exc.error.message + json.dumps(exc.error.data or {}, default=str)
        assert "Traceback" not in text and 'File "' not in text, text[:2000]
        assert "secret-xyz-fuzz" not in text
        return f"error {code}"
    assert not result.is_error, f"{name}({_short(args)}) -> isError {[getattr(c, 'text', '') for c in result.content]}"
    assert isinstance(result.structured_content, dict)
    assert "secret-xyz-fuzz" not in json.dumps(result.structured_content, default=str)
    return "ok"


def _short(args: dict[str, Any]) -> str:
    return json.dumps(args, default=str)[:400]


def test_fuzz_every_mcp_tool(mcp_client):
    call, tools = mcp_client
    assert len(tools) >= 7
    outcomes: dict[str, dict[str, int]] = {}
    calls = 0
    for tool in tools:
        seen = outcomes.setdefault(tool.name, {})

        @settings(max_examples=MCP_EXAMPLES_PER_TOOL, **HYPOTHESIS)
        @given(args=arguments(tool))
        def fuzz(args: dict[str, Any]) -> None:
            nonlocal calls
            calls += 1
            outcome = check_mcp_outcome(tool.name, args, call)
            seen[outcome] = seen.get(outcome, 0) + 1

        fuzz()
    print("MCP fuzz outcomes:", json.dumps(outcomes))
    # Plus the odd ones: unknown tools, non-dict arguments through the raw session.
    for name in ("no_such_tool", "", "query_knowledge_base\x00", "../get_status"):
        calls += 1
        assert check_mcp_outcome(name, {}, call) == f"error {INVALID_PARAMS}"
    assert calls >= 7 * MCP_EXAMPLES_PER_TOOL * 0.9, calls
    assert sum(v.get("ok", 0) for v in outcomes.values()) > 30, outcomes  # the fuzz reaches the real code too
    _COUNTS["mcp"] = calls


_COUNTS: dict[str, int] = {}


# -- CLI ------------------------------------------------------------------------------------------------
SKIP_COMMANDS = {("serve",), ("kb", "watch")}  # they run until stopped


def cli_commands() -> list[tuple[tuple[str, ...], Any]]:
    import typer

    from research_agent.cli.main import app

    out = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, (*path, name))
        elif path not in SKIP_COMMANDS:
            out.append((path, command))

    walk(typer.main.get_command(app), ())
    return out


def safe_arg(value: str, base: Path) -> str:
    """The CLI trusts its user with any path: keep generated paths from escaping the test's folder."""
    value = value.replace("\x00", "")
    if value.startswith(("/", "~", "\\")) or ".." in value:
        return "missing/" + value.lstrip("/~\\").replace("..", "__")
    return value


def test_fuzz_every_cli_command(fake_embedder, monkeypatch):
    from typer.testing import CliRunner

    from research_agent.cli.main import app

    monkeypatch.setenv("RESEARCH_AGENT_RERANK", "false")
    monkeypatch.setenv("RESEARCH_AGENT_API_KEYS", "secret-xyz-fuzz")
    monkeypatch.setenv("RESEARCH_AGENT_LOCK_TIMEOUT", "2")
    runner = CliRunner()
    base = Path.cwd()
    notes = base / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# Retries\n\nuniq retries use exponential backoff.\n", encoding="utf-8")
    assert runner.invoke(app, ["collections", "create", "fuzz-col"]).exit_code == 0
    assert runner.invoke(app, ["projects", "create", "fuzz-proj"]).exit_code == 0
    assert runner.invoke(app, ["kb", "add-folder", "notes", "--collection", "fuzz-col"]).exit_code == 0
    commands = cli_commands()
    assert len(commands) >= 20, [p for p, _ in commands]
    cli_values = st.one_of(st.sampled_from(NAMES[:6] + ["notes", "notes/a.md", "fuzz-col,other-col", "0", "-1",
                                                        "999999999999", "nan", "--", "-", "--json"]),
                           st.text(max_size=30), st.sampled_from(["é" * 300, "x" * 20_000, "\u202e"]))

    @st.composite
    def argv(draw: Any) -> list[str]:
        path, command = draw(st.sampled_from(commands))
        args: list[str] = []
        if draw(st.booleans()):
            args.append("--json")
        if draw(st.integers(0, 9)) == 0:
            args += draw(st.sampled_from([["--store", "alt-store"], ["-v"], ["-q"], ["--config", "missing.yaml"],
                                          ["--chroma-host", "127.0.0.1", "--chroma-port", "1"]]))
        args += list(path)
        for param in command.params:
            if param.name == "help" or draw(st.floats(0, 1)) < 0.35:
                continue
            if param.param_type_name == "argument":
                args += [draw(cli_values) for _ in range(draw(st.integers(1, 2)))]
            elif getattr(param, "is_flag", False) or getattr(param, "count", False):
                args.append(draw(st.sampled_from(param.opts + list(param.secondary_opts or []))))
            else:
                args += [draw(st.sampled_from(param.opts)), draw(cli_values)]
        if draw(st.integers(0, 7)) == 0:
            args.insert(draw(st.integers(0, len(args))), draw(st.sampled_from(["--bogus", "-Z", "extra", "--top-k"])))
        return [safe_arg(a, base) for a in args]

    outcomes: dict[int, int] = {}
    calls = 0

    @settings(max_examples=CLI_EXAMPLES, **HYPOTHESIS)
    @given(args=argv())
    def fuzz(args: list[str]) -> None:
        nonlocal calls
        calls += 1
        result = runner.invoke(app, args, input="y\n", prog_name="research-agent")
        out = result.stdout + result.stderr
        described = f"{args!r:.500} -> exit {result.exit_code}\n{out[-2000:]}"
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            f"{described}\n{result.exception!r}"
        allowed = {0, 2, 3, 4, 5, 6} | ({1} if "doctor" in args else set())
        assert result.exit_code in allowed, described
        assert "Traceback" not in out, described
        assert "secret-xyz-fuzz" not in out, described
        if "--json" in args[:2] and result.exit_code in {3, 4, 5, 6}:
            error = json.loads(result.stderr.strip().splitlines()[-1])["error"]
            assert error["code"] in CODED and error["type"] != "SystemError", described
        outcomes[result.exit_code] = outcomes.get(result.exit_code, 0) + 1

    fuzz()
    print("CLI fuzz exit codes:", outcomes)
    assert calls >= CLI_EXAMPLES * 0.9, calls
    assert outcomes.get(0, 0) >= 5 and len(outcomes) >= 3, outcomes
    _COUNTS["cli"] = calls
    if "mcp" in _COUNTS:
        assert _COUNTS["mcp"] + _COUNTS["cli"] >= 1000, _COUNTS
