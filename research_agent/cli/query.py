"""`research-agent query "TEXT"`"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from research_agent.cli import render
from research_agent.cli.state import get_state, split_names


def query(ctx: typer.Context, text: str = typer.Argument(..., metavar="TEXT", help="What to search for."),
          collections: Optional[str] = typer.Option(None, "--collections", metavar="A,B",
                                                    help="Comma-separated collections (default: all)."),
          project: Optional[str] = typer.Option(None, "--project", help="Search this project's default collections."),
          top_k: int = typer.Option(10, "--top-k", help="How many results."),
          document_context: Optional[str] = typer.Option(None, "--document-context",
                                                         help="Text you are working on, to steer the ranking."),
          context_file: Optional[Path] = typer.Option(None, "--context-file", help="Read --document-context from a file."),
          mode: Literal["hybrid", "semantic", "keyword"] = typer.Option("hybrid", "--mode", help="Retrieval mode."),
          no_rerank: bool = typer.Option(False, "--no-rerank", help="Skip the cross-encoder reranker.")) -> None:
    """Search the knowledge base."""
    from research_agent.query import query_knowledge

    if collections is not None and project is not None:
        raise typer.BadParameter("pass either --collections or --project, not both", param_hint="'--project'")
    state = get_state(ctx)
    context = _context(document_context, context_file)
    result = query_knowledge(state.container(), text, collections=split_names(collections), project=project,
                             top_k=top_k, document_context=context, mode=mode, rerank=not no_rerank)
    render.emit(state, result, render.query_result)


def _context(text: str | None, file: Path | None) -> str | None:
    if text is not None and file is not None:
        raise typer.BadParameter("pass either --document-context or --context-file, not both",
                                 param_hint="'--context-file'")
    if file is None:
        return text
    from research_agent.errors import DocumentError

    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"Cannot read {file}: {getattr(exc, 'strerror', None) or exc}",
                            guidance="Pass a readable UTF-8 text file to --context-file.", path=str(file)) from None
