"""`research-agent projects ...`"""

from __future__ import annotations

from typing import Optional

import typer

from research_agent.cli import render
from research_agent.cli.collections import CURSOR, LIMIT
from research_agent.cli.state import get_state, split_names

app = typer.Typer(help="Group collections into projects and choose each project's default collections.",
                  no_args_is_help=True)

NAME = typer.Argument(..., metavar="NAME", help="Project name.")


def _collections(help: str) -> typer.models.OptionInfo:
    return typer.Option(..., "--collections", metavar="A,B", help=help)


@app.command("create")
def create(ctx: typer.Context, name: str = NAME,
           description: str = typer.Option("", "--description", help="What the project is.")) -> None:
    """Create a project."""
    from research_agent.catalog.projects import create_project

    state = get_state(ctx)
    render.emit(state, create_project(state.container(), name, description=description), render.project_info)


@app.command("list")
def list_(ctx: typer.Context, limit: Optional[int] = LIMIT, cursor: Optional[str] = CURSOR) -> None:
    """List projects."""
    from research_agent.catalog.projects import list_projects

    state = get_state(ctx)
    render.emit(state, state.read(list_projects, limit=limit, cursor=cursor),
                render.paged(render.project_list, "projects"))


@app.command("info")
def info(ctx: typer.Context, name: str = NAME) -> None:
    """Show a project's collections and defaults."""
    from research_agent.catalog.projects import get_project_info

    state = get_state(ctx)
    render.emit(state, state.read(get_project_info, name), render.project_info)


@app.command("delete")
def delete(ctx: typer.Context, name: str = NAME,
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")) -> None:
    """Delete a project (its collections stay)."""
    from research_agent.catalog.projects import delete_project

    state = get_state(ctx)
    render.confirm(state, f"Delete project {name!r}? Its collections are kept.", yes)
    render.emit(state, delete_project(state.container(), name), render.deleted)


@app.command("link")
def link(ctx: typer.Context, name: str = NAME,
         collections: str = _collections("Comma-separated collections to link.")) -> None:
    """Link collections to a project."""
    from research_agent.catalog.projects import link_collections

    state = get_state(ctx)
    render.emit(state, link_collections(state.container(), name, split_names(collections)), render.project_info)


@app.command("unlink")
def unlink(ctx: typer.Context, name: str = NAME,
           collections: str = _collections("Comma-separated collections to unlink.")) -> None:
    """Unlink collections from a project."""
    from research_agent.catalog.projects import unlink_collections

    state = get_state(ctx)
    render.emit(state, unlink_collections(state.container(), name, split_names(collections)), render.project_info)


@app.command("set-defaults")
def set_defaults(
    ctx: typer.Context,
    name: str = NAME,
    collections: str = _collections("Comma-separated collections a query with --project searches."),
) -> None:
    """Set the collections a query with --project searches."""
    from research_agent.catalog.projects import set_default_collections

    state = get_state(ctx)
    render.emit(state, set_default_collections(state.container(), name, split_names(collections)),
                render.project_info)
