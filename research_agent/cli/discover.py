"""`research-agent discover "TASK"`, `retrieve ID...`, `dependencies NODE_ID`"""

from __future__ import annotations

from typing import Any, Literal, Optional

import typer
from rich.console import Console

from research_agent.cli import render
from research_agent.cli.state import Dumped, get_state, served_result, split_names
from research_agent.cli.terminal import escape, printable

TaskType = Literal["implement", "debug", "refactor", "document", "review", "design", "test"]


def discover(
    ctx: typer.Context,
    task: str = typer.Argument(..., metavar="TASK", help="The task you are about to do."),
    task_type: Optional[TaskType] = typer.Option(None, "--task-type", help="What kind of task it is."),
    current_file: Optional[str] = typer.Option(
        None, "--current-file", metavar="F", help="The file you are working on (ranks nearby knowledge up)."
    ),
    max_results: int = typer.Option(5, "--max-results", min=1, help="How many recommendations at most."),
    collections: Optional[str] = typer.Option(
        None, "--collections", metavar="A,B", help="Comma-separated collections (default: all)."
    ),
    project: Optional[str] = typer.Option(None, "--project", help="Use this project's default collections."),
) -> None:
    """Recommend the knowledge to read before a task, with scores, reasons and token estimates.

    Examples:

      research-agent discover "Add cursor pagination to the orders endpoint" --task-type implement

      research-agent --json discover "Fix the flaky login test" --current-file tests/test_login.py
    """
    if collections is not None and project is not None:
        raise typer.BadParameter("pass either --collections or --project, not both", param_hint="'--project'")
    state = get_state(ctx)
    args = dict(task_type=task_type, current_file=current_file, max_results=max_results,
                collections=split_names(collections), project=project)
    # Asked of a long-lived MCP server on this store first, as `query` is (cli/query.py): it has the embedding
    # model loaded, which a new process spends most of its ~4 s on.
    served = state.served("discover", query=task, **args)
    checked = served if served is None or state.json else served_result(served, "discover")
    if checked is not None:
        if state.json:
            from research_agent.guidance import for_face

            render.emit(state, Dumped({**served, "message": for_face(str(served.get("message", "")), "cli")}),
                        _discovery)
        else:
            render.emit(state, _in_cli_words(checked), _discovery)
        return
    from research_agent.discovery import discover_context

    result = state.read(discover_context, task, **args)
    render.emit(state, _in_cli_words(result), _discovery)


def _in_cli_words(result: Any) -> Any:
    """The result with its message naming CLI commands: the library writes it for agents ("Call
    retrieve_knowledge with the ids ..."), which people at a shell cannot do. Under --json too, since the
    people who script the CLI read that message as well (issue 15)."""
    from research_agent.guidance import for_face

    return result.model_copy(update={"message": for_face(result.message, "cli")})


def retrieve(ctx: typer.Context, ids: list[str] = typer.Argument(..., metavar="ID...", help="Node ids to fetch."),
             include_children: bool = typer.Option(False, "--include-children", help="Also return sub-sections."),
             format: Literal["markdown", "json", "plain"] = typer.Option("markdown", "--format",
                                                                         help="Content format."),
             collections: Optional[str] = typer.Option(None, "--collections", metavar="A,B",
                                                       help="Comma-separated collections (default: all).")) -> None:
    """Print knowledge nodes in full, reassembled in document order."""
    from research_agent.discovery import retrieve_knowledge

    state = get_state(ctx)
    result = state.read(retrieve_knowledge, ids, include_children=include_children, format=format,
                        collections=split_names(collections))
    render.emit(state, result, _retrieval)


def dependencies(ctx: typer.Context, node_id: str = typer.Argument(..., metavar="NODE_ID"),
                 direction: Literal["upstream", "downstream", "both"] = typer.Option(
                     "both", "--direction", help="upstream: what it is blocked by; downstream: what it blocks."),
                 depth: int = typer.Option(1, "--depth", min=1, help="Levels to follow (capped by the settings)."),
                 collections: Optional[str] = typer.Option(None, "--collections", metavar="A,B",
                                                           help="Comma-separated collections (default: all).")) -> None:
    """Show the nodes a node depends on (blocked_by, parent) and the nodes that depend on it."""
    from research_agent.discovery import get_dependencies

    state = get_state(ctx)
    result = state.read(get_dependencies, node_id, direction=direction, depth=depth,
                        collections=split_names(collections))
    render.emit(state, result, _graph)


def _discovery(console: Console, r: Any) -> None:
    if not r.recommendations:
        console.print(escape(r.message))
        return
    for rank, rec in enumerate(r.recommendations, start=1):
        console.print(
            f"[bold]{rank}.[/bold] [green]{rec.relevance_score:.2f}[/green] {rec.priority.replace('_', ' ')}  "
            f"[bold]{escape(rec.id)}[/bold]  [cyan]{escape(rec.path)}[/cyan]  "
            f"[dim]{rec.estimated_tokens} tokens{' with children' if rec.include_children else ''}[/dim]"
        )
        console.print(f"   {escape(rec.title)} ({escape(rec.type or 'untyped')}): {escape(rec.reason)}")
    console.print(f"[dim]{escape(r.message)} {r.total_available} relevant in all.[/dim]")


def _retrieval(console: Console, r: Any) -> None:
    def show(node: Any) -> None:
        console.print(f"[dim]<!-- {escape(node.id)} · {escape(node.path)} · {node.tokens} tokens -->[/dim]")
        text = node.content if node.sections is None else "\n\n".join(s.text for s in node.sections)
        console.print(printable(text), markup=False)
        console.print()
        for child in node.children:
            show(child)

    for node in r.nodes:
        show(node)
    if r.not_found:
        render.stderr().print(f"[yellow]Not found:[/yellow] {escape(', '.join(r.not_found))}")
    console.print(f"[dim]{r.total_tokens} tokens[/dim]")


def _graph(console: Console, g: Any) -> None:
    console.print(f"[bold]{escape(g.node.id)}[/bold] {escape(g.node.title)} ({escape(g.direction)}, depth {g.depth}"
                  f"{', capped' if g.depth_capped else ''})")
    titles = {n.id: n.title for n in g.nodes}

    def named(node_id: str) -> str:  # ids alone said little to a person: "a.b.c (Release a hotfix)"
        title = titles.get(node_id)
        return escape(node_id) + (f" [dim]({escape(title)})[/dim]" if title else "")

    for e in g.edges:
        console.print(f"  {named(e.source)} --{e.kind}--> {named(e.target)}")
    if not g.edges:
        console.print("  no dependencies")
    for cycle in g.cycles:
        console.print(f"[yellow]cycle:[/yellow] {escape(' -> '.join(cycle + cycle[:1]))}")
    if g.missing:
        console.print(f"[yellow]blocked_by ids with no node:[/yellow] {escape(', '.join(g.missing))}")
