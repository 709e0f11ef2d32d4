"""`research-agent eval`"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from research_agent.cli import render
from research_agent.cli.state import get_state


def eval_command(
    ctx: typer.Context,
    qrels: Path = typer.Option(..., "--qrels", metavar="FILE", help="Judgments: TSV `query-id corpus-id score`."),
    queries: Path = typer.Option(..., "--queries", metavar="FILE", help="Queries: JSONL with _id and text."),
    collection: str = typer.Option(..., "--collection", help="The collection to evaluate."),
    k: int = typer.Option(10, "--k", min=1, help="Cut-off for nDCG@k, Recall@k and MRR@k."),
    corpus: Optional[Path] = typer.Option(
        None, "--corpus", metavar="FILE", help="BEIR corpus.jsonl to ingest first (document key = _id)."
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N judged queries."),
) -> None:
    """Measure retrieval quality per mode (semantic, keyword, hybrid, hybrid+rerank) on your own judgments."""
    from research_agent.search.evaluation import evaluate, ingest_beir_corpus

    state = get_state(ctx)
    c = state.container()
    if corpus is not None:
        ingest_beir_corpus(c, collection, corpus)
    render.emit(state, evaluate(c, collection, queries, qrels, k=k, limit=limit), _report)


def _report(console: Console, r: Any) -> None:
    table = Table(title=f"Retrieval quality on {r.collection}", title_justify="left", title_style="bold")
    for name in ("mode", f"nDCG@{r.k}", f"Recall@{r.k}", f"MRR@{r.k}", "p50 ms", "p95 ms"):
        table.add_column(name)
    for m in r.modes:
        if not m.available:
            table.add_row(m.mode, "unavailable", "", "", "", m.reason or "")
            continue
        table.add_row(
            m.mode,
            f"{m.ndcg:.3f}",
            f"{m.recall:.3f}",
            f"{m.mrr:.3f}",
            f"{m.latency_p50_ms:.0f}",
            f"{m.latency_p95_ms:.0f}",
        )
    console.print(table)
