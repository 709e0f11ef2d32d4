"""`research-agent doctor`"""

from __future__ import annotations

import typer

from research_agent.cli import render
from research_agent.cli.state import get_state
from research_agent.cli.terminal import printable


def doctor(
    ctx: typer.Context,
    repair: bool = typer.Option(False, "--repair", help="Fix what the check finds (orphans, leftovers)."),
) -> None:
    """Check the store for what an interrupted write left behind; --repair fixes it."""
    from research_agent.ops.doctor import REPAIR_ADVICE, run_doctor

    state = get_state(ctx)
    report = run_doctor(state.container(), repair=repair)
    render.emit(state, report, render.doctor_report)
    if not state.json:
        # Notes beside the verdict; the repair line is already in it (render.doctor_report).
        for line in (a for a in report.advice if a != REPAIR_ADVICE):
            render.stderr().print(f"note: {printable(line)}", markup=False, highlight=False)
    if not report.healthy:
        raise typer.Exit(1)
