"""`research-agent query "TEXT"`"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from research_agent.cli import render
from research_agent.cli.inputs import read_stdin
from research_agent.cli.state import Dumped, get_state, served_result, split_names


def query(
    ctx: typer.Context,
    text: str = typer.Argument(..., metavar="TEXT", help="What to search for; - reads it from stdin."),
    collections: Optional[str] = typer.Option(
        None, "--collections", metavar="A,B", help="Comma-separated collections (default: all)."
    ),
    project: Optional[str] = typer.Option(None, "--project", help="Search this project's default collections."),
    top_k: int = typer.Option(10, "--top-k", min=1, help="How many results."),
    document_context: Optional[str] = typer.Option(
        None, "--document-context", help="Text you are working on, to steer the ranking."
    ),
    context_file: Optional[Path] = typer.Option(None, "--context-file",
                                                help="Read --document-context from a file; - reads stdin."),
    mode: Literal["hybrid", "semantic", "keyword"] = typer.Option("hybrid", "--mode", help="Retrieval mode."),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="Skip the cross-encoder reranker."),
    filter: list[str] = typer.Option(
        [],
        "--filter",
        metavar="KEY=VALUE",
        help="Only chunks whose KEY (content_type, kind, node_type, status, tags, "
        "...) is VALUE; a,b means any of them (repeatable).",
    ),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1,
                                             help="Stop adding results at this many tokens."),
    snippets: bool = typer.Option(False, "--snippets", help="Return the most relevant excerpt of each chunk."),
    explain: bool = typer.Option(False, "--explain",
                                 help="Show each hit's ranks, scores and the query words it matched."),
    diverse: bool = typer.Option(False, "--diverse",
                                 help="Move near-copies of a chunk of the same section below the other hits (MMR)."),
) -> None:
    """Search the knowledge base.

    Each hit names where it is, for an editor: `docs/guide.md:42` (file and first line; `kb get` reads around it).

    Examples:

      research-agent query "how do I roll back a release" --collections ops-docs

      research-agent --json query "retry policy" --project web --top-k 5 --mode keyword

      git diff | research-agent query "why does the retry test fail" --context-file -

      echo "retry policy" | research-agent query -

      research-agent query "retry budget" --explain

      research-agent query "retry budget" --diverse
    """
    if collections is not None and project is not None:
        raise typer.BadParameter("pass either --collections or --project, not both", param_hint="'--project'")
    state = get_state(ctx)
    if text == "-" and str(context_file) == "-":
        raise typer.BadParameter("stdin can be read once: pass the query as TEXT or the context as a file",
                                 param_hint="'--context-file'")
    context = _context(document_context, context_file)
    if text == "-":  # the query from a pipe or a here-document, as `kb add-research -` reads its content
        text = read_stdin().strip()
    args = dict(collections=split_names(collections), project=project, top_k=top_k, document_context=context,
                mode=mode, rerank=not no_rerank, filters=parse_filters(filter), max_tokens=max_tokens,
                snippets=snippets, explain=explain, diverse=diverse)
    # A long-lived MCP server on this store with these settings has Chroma's index and the models loaded and its
    # store caught up: asked first, over a local socket, before anything heavy is imported here (issues 12, 16).
    served = state.served("query", query=text, **args)
    # The answer comes from a server running this very code (local_server checks the hash of the code), so
    # `--json` prints it as it is; human output renders this code's QueryResult (None: not one, run here instead).
    checked = served if served is None or state.json else served_result(served, "query")
    if checked is not None:
        render.emit(state, Dumped(served) if state.json else checked, render.query_result)
        return
    from research_agent.search.service import query_knowledge

    # The store opens (chromadb's import and client: 0.5-1.5 s on 2 shared cores) in a thread while this one loads
    # the query's models and embeds the query, which then cost ~nothing more (benchmarks/cli_latency.py, CLI latency
    # section of benchmarks/README.md). Same results; errors surface from the search as before.
    c = state.container()
    c.open_store_in_background()
    c.warm_query(text, mode, not no_rerank)
    c.wait_for_store()
    result = state.read(query_knowledge, text, **args)
    render.emit(state, result, render.query_result)


def _context(text: str | None, file: Path | None) -> str | None:
    if text is not None and file is not None:
        raise typer.BadParameter("pass either --document-context or --context-file, not both",
                                 param_hint="'--context-file'")
    if file is None:
        return text
    if str(file) == "-":  # `git diff | research-agent query "..." --context-file -` ("Cannot read -" before)
        return read_stdin()
    from research_agent.errors import DocumentError

    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"Cannot read {file}: {getattr(exc, 'strerror', None) or exc}",
                            guidance="Pass a readable UTF-8 text file to --context-file.", path=str(file)) from None


def parse_filters(items: list[str]) -> dict[str, str | list[str]] | None:
    """`--filter content_type=code_block --filter kind=note,research` -> the query's filters dict."""
    out: dict[str, str | list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="'--filter'")
        values = [v.strip() for v in value.split(",") if v.strip()]
        out[key.strip()] = values if len(values) > 1 else values[0]
    return out or None
