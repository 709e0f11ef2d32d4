"""The `research-agent` app: global options, command groups, and the one place errors become exit codes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, Optional

import typer

# typer 0.29 vendors its own click: the exceptions it raises are that copy's classes, not click's.
from typer._click.exceptions import UsageError
from typer.core import TyperGroup

from research_agent.cli import (
    backup,
    collections,
    discover,
    doctor,
    eval,
    kb,
    projects,
    query,
    records,
    serve,
    status,
    web,
)
from research_agent.cli.inputs import decode_args
from research_agent.cli.state import CliState, get_state

log = logging.getLogger("research_agent.cli")


JSON_FLAG = "--json"
#: ctx.meta key: the raw command line asked for --json (known before any parsing, so usage errors can honour it).
JSON_REQUESTED = "research_agent.json_requested"
#: JSON-RPC's "invalid params", the code DESIGN.md gives usage errors (exit 2) on both faces.
USAGE_ERROR_CODE = -32602
#: The status of a Unix tool killed by SIGPIPE (128 + 13) when its reader went away (`| head`).
BROKEN_PIPE_EXIT = 141
#: Columns of `--help` written to a pipe or file: the longest option line of ours (~190 characters with its
#: columns) fits, and the help panels, which span the whole width, stay readable.
PIPED_HELP_WIDTH = 200


def json_requested(args: list[str]) -> bool:
    """`--json` anywhere before a `--` terminator: global (`--json status`) or after the command (`status --json`)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == JSON_FLAG:
            return True
    return False


def _set_json(ctx: typer.Context, value: bool) -> None:
    if value:
        get_state(ctx).json = True


def _late_json_option() -> Any:
    """`--json` after the command: the README says every command takes it, and scripts write it there. Built by
    typer from a one-option command, since typer's parameter classes are its own."""
    def command(json_output: bool = typer.Option(False, JSON_FLAG, callback=_set_json, expose_value=False,
                                                 help="Machine output: one JSON object on stdout (as the global "
                                                      "--json).")) -> None: ...

    holder = typer.Typer()
    holder.command()(command)
    return typer.main.get_command(holder).params[0]


def _leaf_commands(group: Any) -> Iterator[Any]:
    for command in group.commands.values():
        if hasattr(command, "commands"):
            yield from _leaf_commands(command)
        else:
            yield command


def _sub_groups(group: Any) -> Iterator[Any]:
    for command in group.commands.values():
        if hasattr(command, "commands"):
            yield command
            yield from _sub_groups(command)


def _no_help_for_missing_commands(root: Any) -> None:
    """Under --json, `collections` alone is the usage error "Missing command." (one JSON line on stderr), not
    its help on stdout beside an error with an empty message: typer's help prints itself while the error is
    being built (click's NoArgsIsHelpError). The command tree is built afresh for every run of the app."""
    for group in _sub_groups(root):
        group.no_args_is_help = False


def _wide_piped_help() -> None:
    """Help to a pipe or file at PIPED_HELP_WIDTH columns instead of Rich's 80, so `--help | grep` finds whole
    sentences; a terminal keeps its own width, and TERMINAL_WIDTH (docs generation) wins over both."""
    if os.environ.get("TERMINAL_WIDTH"):
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if sys.stdout.isatty():
            return
    from typer import rich_utils

    rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH


def usage_error_exit(exc: UsageError) -> typer.Exit:
    """Write a usage error as the JSON error object scripts parse on stderr; the exit code stays 2."""
    path = exc.ctx.command_path if exc.ctx is not None else "research-agent"
    message = exc.format_message()
    error = {"code": USAGE_ERROR_CODE, "type": "InvalidParams", "message": message,
             "data": {"type": "InvalidParams", "guidance": f"Run `{path} --help` for the usage.", "retryable": False}}
    sys.stderr.write(json.dumps({"error": error}) + "\n")
    sys.stderr.flush()
    return typer.Exit(exc.exit_code)


def is_broken_pipe(exc: BaseException) -> bool:
    """A write to a stdout whose reader went away (`| head`): BrokenPipeError from a plain write (JSON, echo),
    or rich's way of saying it (help and tables): Console.on_broken_pipe points stdout at /dev/null and raises
    SystemExit(1); no command of ours raises SystemExit itself (errors are typer.Exit)."""
    if isinstance(exc, BrokenPipeError):
        return True
    if not isinstance(exc, SystemExit) or exc.code != 1:
        return False
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(os.devnull))
    except (OSError, ValueError):  # ValueError: no fileno (a test runner's stdout)
        return False


def broken_pipe_exit() -> typer.Exit:
    """Stop quietly, as `cat big | head -1` does: exit 141, nothing on stderr. Python ignores SIGPIPE, so a write
    to a closed stdout raised BrokenPipeError, reported as "Unexpected failure" (issue 15). stdout goes to
    /dev/null first, or the interpreter's final flush of what is still buffered fails again on its way out."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return typer.Exit(BROKEN_PIPE_EXIT)


class ResearchAgentGroup(TyperGroup):
    """The root group; its invoke() wraps every command, so errors are mapped here and nowhere else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in _leaf_commands(self):
            command.params.append(_late_json_option())
        for group in _sub_groups(self):  # `collections --json`: "No such option" before
            group.params.append(_late_json_option())

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args = decode_args(args)
        ctx.meta[JSON_REQUESTED] = json_requested(args)
        _wide_piped_help()
        if ctx.meta[JSON_REQUESTED]:
            _no_help_for_missing_commands(self)
        try:
            return super().parse_args(ctx, args)
        except (BrokenPipeError, SystemExit) as exc:  # the root's --help or --version, to a closed pipe
            if is_broken_pipe(exc):
                raise broken_pipe_exit() from None
            raise
        except UsageError as exc:  # an error in the global options, before any command
            if ctx.meta[JSON_REQUESTED]:
                raise usage_error_exit(exc) from None
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:  # an unknown command, a bad option or argument of the command
            if ctx.meta.get(JSON_REQUESTED) or get_state(ctx).json:
                raise usage_error_exit(exc) from None
            raise
        except (typer.TyperException, typer.Exit, typer.Abort):
            raise  # usage errors (exit 2), explicit exits and aborts keep Typer's handling
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except (BrokenPipeError, SystemExit) as exc:  # output (or a command's --help) to a closed pipe
            if is_broken_pipe(exc):
                raise broken_pipe_exit() from None
            raise
        except Exception as exc:  # noqa: BLE001 - this is the CLI's single error boundary
            raise typer.Exit(handle_error(get_state(ctx), exc)) from None


def handle_error(state: CliState, exc: Exception) -> int:
    """Report `exc` on stderr (JSON under --json) and return its exit code."""
    from research_agent.cli import render
    from research_agent.errors import ResearchAgentError, as_research_agent_error

    if isinstance(exc, ResearchAgentError):
        log.debug("%s: %s", type(exc).__name__, exc.message, exc_info=exc)
    else:
        # The traceback is for the log only (shown at -v); users see the sanitized message.
        log.log(logging.ERROR if state.verbose else logging.DEBUG, "unexpected failure", exc_info=exc)
    err = as_research_agent_error(exc)
    render.error(state, err)
    return err.exit_code


app = typer.Typer(
    name="research-agent",
    cls=ResearchAgentGroup,
    help="A local-first knowledge base shared by coding agents and people.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(ctx: typer.Context, value: bool) -> None:
    if value:
        from research_agent import __version__

        # --version is eager (it runs before --json is parsed), so --json is read from the raw command line.
        if ctx.meta.get(JSON_REQUESTED):
            typer.echo(json.dumps({"version": __version__}))
        else:
            typer.echo(f"research-agent {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    json_output: bool = typer.Option(False, "--json", help="Machine output: one JSON object on stdout."),
    # Strings, not Paths: Typer turns "" into Path("."), and an empty value must reach the settings' checks.
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help="YAML config file."),
    store: Optional[str] = typer.Option(None, "--store", metavar="PATH", help="Embedded store folder."),
    chroma_host: Optional[str] = typer.Option(None, "--chroma-host", help="Use the Chroma server on this host."),
    chroma_port: Optional[int] = typer.Option(None, "--chroma-port", help="Chroma server port."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                 help="Log more: -v INFO, -vv DEBUG."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Log errors only; no progress bars."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, expose_value=False,
                                 help="Print the version and exit."),
) -> None:
    """A local-first knowledge base shared by coding agents and people."""
    ctx.obj = CliState(json=json_output, config_file=config, store=store, chroma_host=chroma_host,
                       chroma_port=chroma_port, verbose=verbose, quiet=quiet)
    ctx.call_on_close(ctx.obj.close)


app.add_typer(collections.app, name="collections")
app.add_typer(projects.app, name="projects")
app.add_typer(kb.app, name="kb")
# Commands of the kb group kept in their own modules (one concern each); `kb --help` lists them after kb.py's.
kb.app.command("add-url")(web.add_url)
kb.app.command("add-records")(records.add_records)
app.command("query")(query.query)
app.command("status")(status.status)
app.command("discover")(discover.discover)
app.command("retrieve")(discover.retrieve)
app.command("dependencies")(discover.dependencies)
app.command("eval")(eval.eval_command)
app.command("doctor")(doctor.doctor)
app.command("serve")(serve.serve)
app.command("export")(backup.export_command)
app.command("import")(backup.import_command)
