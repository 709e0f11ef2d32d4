"""`research-agent kb add-records FILE`: a JSON, JSONL or CSV file whose records are each a document.

The lead registers it under the kb group (research_agent/cli/kb.py): `app.command("add-records")(add_records)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import typer
from rich.console import Console

from research_agent.cli import render
from research_agent.cli.state import get_state

RecordFormat = Literal["json", "jsonl", "csv", "tsv"]


def add_records(
    ctx: typer.Context,
    path: Path = typer.Argument(..., metavar="FILE", help="A .json, .jsonl/.ndjson, .csv or .tsv file."),
    collection: str = typer.Option(..., "--collection", help="Target collection."),
    id_field: str = typer.Option(..., "--id-field", metavar="F", help="The field that identifies a record."),
    text_field: list[str] = typer.Option(..., "--text-field", metavar="F",
                                         help="Field(s) whose text is the document (repeatable, joined)."),
    title_field: Optional[str] = typer.Option(None, "--title-field", metavar="F", help="Default: the id."),
    keywords_field: Optional[str] = typer.Option(None, "--keywords-field", metavar="F",
                                                 help="A list or a comma-separated string."),
    metadata_field: list[str] = typer.Option([], "--metadata-field", metavar="F",
                                             help="Added as `F: value` lines to the text (repeatable)."),
    records_path: Optional[str] = typer.Option(None, "--records-path", metavar="A.B",
                                               help="JSON: the dotted path of the array of records."),
    format: Optional[RecordFormat] = typer.Option(None, "--format", help="Default: by extension."),
    prune: bool = typer.Option(False, "--prune", help="Remove this file's records that are no longer in it."),
) -> None:
    """Ingest a records file, one document per record; unchanged records are skipped.

    Fields are keys or dotted paths into nested objects (server.name).

    Examples:

      research-agent kb add-records tools.jsonl --collection tools --id-field id --text-field description
      --title-field name --keywords-field tags

      research-agent kb add-records api.json --records-path data.endpoints --collection api --id-field path
      --text-field summary --text-field description --prune
    """
    from research_agent.ingest.records import RecordFields, ingest_records

    fields = RecordFields(id=id_field, text=tuple(text_field), title=title_field, keywords=keywords_field,
                          metadata=tuple(metadata_field), records_path=records_path)
    state = get_state(ctx)
    with render.ingest_progress(state) as progress:
        report = ingest_records(state.container(), path, collection, fields, format=format, prune=prune,
                                progress=progress)
    render.emit(state, report, _records_report)


def _records_report(console: Console, r: Any) -> None:
    render.ingest_report(console, r)
    more = f"; {r.not_listed} more problems or documents not listed" if r.not_listed else ""
    console.print(f"[dim]{r.records_seen} records read ({r.format}){more}.[/dim]", highlight=False)
