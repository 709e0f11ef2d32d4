"""`research-agent export` and `research-agent import`: a collection to and from JSONL (research_agent/ops/backup.py).

`-` (the default for export) is stdout or stdin, so `research-agent export kb | ssh host research-agent import -`
works. When the export itself goes to stdout, its summary goes to stderr (under --json as well: stdout carries
only the export then).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal, Optional

import typer

from research_agent.cli import render
from research_agent.cli.state import get_state

OnConflict = Literal["skip", "replace", "error"]


def export_command(
    ctx: typer.Context,
    collection: str = typer.Argument(..., metavar="COLLECTION", help="Collection to export."),
    output: str = typer.Option("-", "--output", "-o", metavar="FILE",
                               help="File to write (default -: stdout). Written whole or not at all."),
    with_embeddings: bool = typer.Option(False, "--with-embeddings",
                                         help="Include the vectors (about 3x the size), so an import with the same "
                                              "model skips re-embedding."),
    force: bool = typer.Option(False, "--force", help="Replace FILE if it exists."),
) -> None:
    """Export a collection (documents, research, notes, with their metadata) as JSONL.

    Examples:

      research-agent export kb -o kb.jsonl

      research-agent export kb | gzip > kb.jsonl.gz
    """
    from research_agent.ops.backup import export_collection

    state = get_state(ctx)
    if output == "-":
        if sys.stdout.isatty():
            raise typer.BadParameter("refusing to write JSONL to a terminal; pass -o FILE or redirect stdout",
                                     param_hint="'--output'")
        report = export_collection(state.container(), collection, sys.stdout.buffer, with_embeddings=with_embeddings)
        _summary(state, report, _exported, stream=sys.stderr)
        return
    report = export_collection(state.container(), collection, output, with_embeddings=with_embeddings,
                               overwrite=force)
    _summary(state, report, _exported)


def import_command(
    ctx: typer.Context,
    source: str = typer.Argument(..., metavar="FILE", help="An export file, or - for stdin."),
    collection: Optional[str] = typer.Option(None, "--collection",
                                             help="Import under this name (default: the exported collection's)."),
    on_conflict: OnConflict = typer.Option("skip", "--on-conflict",
                                           help="A document already there with other content: skip (keep it), "
                                                "replace, or error (stop)."),
) -> None:
    """Import an export into a collection (created if missing); a re-run finishes an interrupted import.

    Examples:

      research-agent import kb.jsonl

      gunzip -c kb.jsonl.gz | research-agent import - --collection kb-copy --on-conflict replace
    """
    from research_agent.ops.backup import import_collection

    state = get_state(ctx)
    report = import_collection(state.container(), sys.stdin.buffer if source == "-" else source,
                               collection=collection, on_conflict=on_conflict)
    _summary(state, report, _imported)


def _summary(state: Any, report: Any, human: Any, stream: Any = None) -> None:
    """The report as JSON (--json) or a line for people; on `stream` (stderr) when stdout carries the export."""
    if stream is None:
        render.emit(state, report, human)
    elif state.json:
        stream.write(json.dumps(report.model_dump(mode="json")) + "\n")
    else:
        human(render.stderr(), report)
    if not state.json:
        render.warn(report.warnings)


def _exported(console: Any, r: Any) -> None:
    console.print(f"Exported {render.plural(r.documents, 'document')} ({render.plural(r.chunks, 'chunk')}, "
                  f"{r.bytes:,} bytes{', with embeddings' if r.with_embeddings else ''}) of {r.collection} to "
                  f"{r.path}.")


def _imported(console: Any, r: Any) -> None:
    made = "new" if r.created else "existing"
    embedded = "" if not r.chunks else " (embeddings from the file)" if r.with_embeddings else " (embedded)"
    console.print(f"Imported {render.plural(r.documents, 'document')} from {r.path} into {made} collection "
                  f"{r.collection}: {r.added} added, {r.replaced} replaced, {r.unchanged} unchanged, {r.skipped} kept "
                  f"with other content; {render.plural(r.chunks, 'chunk')} written{embedded}.")
