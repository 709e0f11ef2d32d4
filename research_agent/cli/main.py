"""The `research-agent` app: global options, command groups, and the one place errors become exit codes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from research_agent.cli import collections, discover, doctor, eval, kb, projects, query, serve, status
from research_agent.cli.state import CliState, get_state

log = logging.getLogger("research_agent.cli")


class ResearchAgentGroup(TyperGroup):
    """The root group; its invoke() wraps every command, so errors are mapped here and nowhere else."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.TyperException, typer.Exit, typer.Abort):
            raise  # usage errors (exit 2), explicit exits and aborts keep Typer's handling
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
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


@app.callback()
def main(
    ctx: typer.Context,
    json_output: bool = typer.Option(False, "--json", help="Machine output: one JSON object on stdout."),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help="YAML config file."),
    store: Optional[Path] = typer.Option(None, "--store", metavar="PATH", help="Embedded store folder."),
    chroma_host: Optional[str] = typer.Option(None, "--chroma-host", help="Use the Chroma server on this host."),
    chroma_port: Optional[int] = typer.Option(None, "--chroma-port", help="Chroma server port."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                 help="Log more: -v INFO, -vv DEBUG."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Log errors only; no progress bars."),
) -> None:
    """A local-first knowledge base shared by coding agents and people."""
    ctx.obj = CliState(json=json_output, config_file=config, store=store, chroma_host=chroma_host,
                       chroma_port=chroma_port, verbose=verbose, quiet=quiet)
    ctx.call_on_close(ctx.obj.close)


app.add_typer(collections.app, name="collections")
app.add_typer(projects.app, name="projects")
app.add_typer(kb.app, name="kb")
app.command("query")(query.query)
app.command("status")(status.status)
app.command("discover")(discover.discover)
app.command("retrieve")(discover.retrieve)
app.command("dependencies")(discover.dependencies)
app.command("eval")(eval.eval_command)
app.command("doctor")(doctor.doctor)
app.command("serve")(serve.serve)
