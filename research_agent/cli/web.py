"""`research-agent kb add-url URL...`: web pages into a collection (research_agent/ingest/web.py)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from research_agent.cli import render
from research_agent.cli.collections import create as create_collection
from research_agent.cli.state import get_state
from research_agent.cli.terminal import escape

URLS = typer.Argument(..., metavar="URL...", help="http(s) URLs of pages to fetch (hosts allowed by "
                                                   "RESEARCH_AGENT_URL_ALLOWED_HOSTS).")


def add_url(ctx: typer.Context, urls: list[str] = URLS,
            collection: str = typer.Option(..., "--collection", help="Target collection."),
            strict: bool = typer.Option(False, "--strict", help="Exit 5 if any URL fails (default: only when "
                                                                  "all do)."),
            create: bool = typer.Option(False, "--create", help="Create the collection if it does not exist.")
            ) -> None:
    """Fetch web pages and store their main text; adding a URL again refreshes it (unchanged pages write
    nothing; a page now answering 404/410 is removed). One page is one document however its URL is spelt
    (the key is the final URL after redirects, RFC 3986-normalised: #fragment dropped, a trailing slash
    kept). Failures are listed with their reason; the exit status is 5 when every URL failed (or any, with --strict), as
    `kb add-folder` reports skipped files.

    Example: RESEARCH_AGENT_URL_ALLOWED_HOSTS=docs.python.org research-agent kb add-url
    https://docs.python.org/3/library/json.html --collection python
    """
    from research_agent.errors import DocumentError
    from research_agent.ingest.web import add_urls

    state = get_state(ctx)
    if create:
        create_collection(state, collection, type=None, exist_ok=True)
    report = add_urls(state.container(), collection, list(urls))
    render.emit(state, report, url_report)
    if report.failed and (strict or report.failed == len(report.results)):
        raise typer.Exit(code=DocumentError.exit_code)


def url_report(console: Console, r: Any) -> None:
    for item in r.results:
        if item.status == "failed":
            console.print(f"[red]failed[/red] {escape(item.url)}: {escape(item.reason or '')}")
        elif item.status == "removed":
            console.print(f"removed {escape(item.document or '')}: {escape(item.reason or '')}")
        else:
            console.print(f"{item.status} {escape(item.url)} -> {escape(item.document or '')} "
                          f"({render.plural(item.chunks_written, 'chunk')} written)")
        for doc in item.removed_documents:  # every deletion is named, not only a 404's
            if doc != item.document:
                console.print(f"removed {escape(doc)} (older key of {escape(item.document or '')})")
    removed = f"{r.removed} removed, " if r.removed else ""
    console.print(f"{r.added} added, {r.updated} updated, {r.unchanged} unchanged, {removed}{r.failed} failed "
                  f"in {escape(r.collection)}.")
