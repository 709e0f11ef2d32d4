"""`research-agent collections ...`"""

from __future__ import annotations

from typing import Any, Literal, Optional

import typer

from research_agent.cli import render
from research_agent.cli.state import get_state

app = typer.Typer(help="Create, list, inspect and delete collections.", no_args_is_help=True)

CollectionType = Literal["fundamental", "project-specific"]


def _check_limit(value: int | None) -> int | None:
    """A limit out of 1..MAX_PAGE is a usage error (exit 2) like any bad option, not the library's QueryError
    (exit 6); MAX_PAGE is imported here, not at module level, so `--help` never loads pydantic."""
    if value is None:
        return None
    from research_agent.catalog.common import MAX_PAGE

    if not 1 <= value <= MAX_PAGE:
        raise typer.BadParameter(f"{value} is not in the range 1 to {MAX_PAGE}.")
    return value


# Paging of every list command (catalog/common.py paginate: keyset cursors, 100 a page by default).
LIMIT = typer.Option(None, "--limit", callback=_check_limit, help="Show at most this many (default 100).")
CURSOR = typer.Option(None, "--cursor", help="Continue after the page that printed this cursor.")


@app.command("create")
def create_command(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="Collection name (3-512 of a-z A-Z 0-9 . _ -)."),
    type: Optional[CollectionType] = typer.Option(None, "--type", show_default=False,
                                                  help="Collection type (default: project-specific)."),
    project: Optional[str] = typer.Option(None, "--project", help="Link the collection to this project."),
    description: Optional[str] = typer.Option(None, "--description", help="What the collection holds."),
    exist_ok: bool = typer.Option(False, "--exist-ok", help="If it exists already, use it: link it to --project; "
                                                            "another --type fails, another --description is kept "
                                                            "with a warning."),
) -> None:
    """Create a collection (`created` in the JSON result says whether this run did).

    Examples:

      research-agent collections create ops-docs --type fundamental --description "Runbooks"

      research-agent collections create api-docs --project web --exist-ok
    """
    state = get_state(ctx)
    info = create(state, name, type=type, description=description, project=project, exist_ok=exist_ok)
    render.emit(state, info, render.collection_info)


def create(state: Any, name: str, *, type: str | None, description: str | None = None, project: str | None = None,
           exist_ok: bool = False) -> Any:
    """ensure_collection, its warnings (a kept description) on stderr for people; --json carries them."""
    from research_agent.catalog.collections import ensure_collection

    info = ensure_collection(state.container(), name, type=type, description=description, project=project,
                             exist_ok=exist_ok)
    if not state.json:
        render.warn(info.warnings)
    return info


@app.command("list")
def list_(
    ctx: typer.Context,
    type: Optional[CollectionType] = typer.Option(None, "--type", help="Only collections of this type."),
    project: Optional[str] = typer.Option(None, "--project", help="Only collections linked to this project."),
    limit: Optional[int] = LIMIT,
    cursor: Optional[str] = CURSOR,
) -> None:
    """List collections.

    Examples:

      research-agent collections list --type fundamental

      research-agent collections list --json | jq -r '.collections[].name'
    """
    from research_agent.catalog.collections import list_collections

    state = get_state(ctx)
    result = state.read(list_collections, type=type, project=project, limit=limit, cursor=cursor)
    render.emit(state, result, render.paged(render.collection_list, "collections"))


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
