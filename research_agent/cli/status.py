"""`research-agent status`"""

from __future__ import annotations

import typer

from research_agent.cli import render
from research_agent.cli.state import get_state


def status(ctx: typer.Context,
           check_reranker: bool = typer.Option(False, "--check-reranker",
                                               help="Load the reranker to report whether it works (slow).")) -> None:
    """Show the store, the models and what the knowledge base holds."""
    from research_agent.ops.status import get_status

    state = get_state(ctx)
    render.emit(state, state.read(get_status, check_reranker=check_reranker), render.status_report)
    store = state.container().store
    if not state.json and not state.quiet and not store.exists:  # reads never create it: a mistyped --store shows
        where = store.location
        said = (f"the folder {where} holds no store yet" if store.settings.store.is_dir()
                else f"the store {where} does not exist yet")
        render.stderr().print(f"note: {said}; the first write (e.g. `research-agent collections create NAME`) "
                              "creates it there.", markup=False, highlight=False)
