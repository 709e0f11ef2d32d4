"""`research-agent collections ...`"""

from __future__ import annotations

from typing import Literal, Optional

import typer

from research_agent.cli import render
from research_agent.cli.state import get_state

app = typer.Typer(help="Create, list, inspect and delete collections.", no_args_is_help=True)

CollectionType = Literal["fundamental", "project-specific"]


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="Collection name (3-512 of a-z A-Z 0-9 . _ -)."),
    type: CollectionType = typer.Option("project-specific", "--type", help="Collection type."),
    project: Optional[str] = typer.Option(None, "--project", help="Link the new collection to this project."),
    description: str = typer.Option("", "--description", help="What the collection holds."),
) -> None:
    """Create a collection."""
    from research_agent.catalog.collections import create_collection

    state = get_state(ctx)
    info = create_collection(state.container(), name, type=type, description=description, project=project)
    render.emit(state, info, render.collection_info)


@app.command("list")
def list_(
    ctx: typer.Context,
    type: Optional[CollectionType] = typer.Option(None, "--type", help="Only collections of this type."),
    project: Optional[str] = typer.Option(None, "--project", help="Only collections linked to this project."),
) -> None:
    """List collections."""
    from research_agent.catalog.collections import list_collections

    state = get_state(ctx)
    render.emit(state, state.read(list_collections, type=type, project=project), render.collection_list)


@app.command("info")
def info(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME", help="Collection name.")) -> None:
    """Show a collection's settings and counts."""
    from research_agent.catalog.collections import get_collection_info

    state = get_state(ctx)
    render.emit(state, state.read(get_collection_info, name), render.collection_info)


@app.command("delete")
def delete(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME", help="Collection name."),
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")) -> None:
    """Delete a collection and all its documents."""
    from research_agent.catalog.collections import delete_collection

    state = get_state(ctx)
    render.confirm(state, f"Delete collection {name!r} and all its documents?", yes)
    render.emit(state, delete_collection(state.container(), name), render.deleted)
