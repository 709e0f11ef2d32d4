"""Output: `--json` writes the result model as one JSON object on stdout; otherwise rich tables for people.

Errors and progress go to stderr so stdout stays parseable in both modes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from research_agent.cli.state import CliState
from research_agent.cli.terminal import escape, printable

#: Width of output that is not a terminal (a pipe, a file): wide enough that nothing wraps, since scripts grep
#: lines and Rich's 80-column default for pipes cut table cells and messages in two.
PIPED_WIDTH = 10_000


def _console(**kwargs: Any) -> Console:
    console = Console(highlight=False, **kwargs)
    if not console.is_terminal:
        console.width = PIPED_WIDTH
    return console


def stdout() -> Console:
    # A fresh Console per call picks up sys.stdout as it is now (CliRunner swaps it).
    return _console(soft_wrap=False)


def stderr() -> Console:
    return _console(stderr=True)


def plural(n: int, word: str) -> str:
    """`1 chunk`, `2 chunks`: the words of our summaries all take a plain s."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def emit(state: CliState, result: Any, human: Callable[[Console, Any], None]) -> None:
    """The single output path: the model's JSON shape for scripts, `human(console, result)` for people."""
    if state.json:
        typer.echo(json.dumps(result.model_dump(mode="json")))
    else:
        human(stdout(), result)


def error(state: CliState, err: Any) -> None:
    """A ResearchAgentError on stderr: one JSON line under --json, a red message and guidance otherwise.

    Guidance written for agents ("Call retrieve_knowledge ...") is turned into the CLI command that does the
    same (research_agent.guidance), so people at a shell are never told to call an MCP tool."""
    from research_agent.guidance import for_face

    payload = err.to_dict()
    payload["message"] = for_face(payload["message"], "cli")
    payload["data"] = {**payload["data"]}
    if isinstance(payload["data"].get("guidance"), str):
        payload["data"]["guidance"] = for_face(payload["data"]["guidance"], "cli")
    if state.json:
        sys.stderr.write(json.dumps({"error": payload}) + "\n")
        sys.stderr.flush()
        return
    console = stderr()
    console.print(f"[bold red]Error:[/bold red] {escape(payload['message'])}")
    guidance = payload["data"].get("guidance")
    if guidance:
        console.print(f"[dim]{escape(str(guidance))}[/dim]")


def warn(warnings: list[str]) -> None:
    """Warnings go to stderr, so `research-agent query ... | head` shows results only."""
    console = stderr()
    for warning in warnings:
        console.print(f"[yellow]Warning:[/yellow] {escape(warning)}")


def confirm(state: CliState, question: str, yes: bool) -> None:
    """Ask before destroying data; without a terminal under --json, refuse rather than block or guess."""
    if yes:
        return
    if state.json and not sys.stdin.isatty():
        raise typer.BadParameter("refusing to delete without confirmation; pass --yes", param_hint="'--yes'")
    # The prompt goes to stderr so it never mixes into --json output.
    typer.confirm(question, abort=True, err=True)


class RateColumn(ProgressColumn):
    """Files per second, the unit of the bar's fixed total; seconds per file when slower than one a second (a
    single large file read "0.0 files/s" for its whole embedding)."""

    def render(self, task: Any) -> Text:
        speed = task.finished_speed or task.speed
        if not speed:
            return Text("", style="progress.data.speed")
        return Text(f"{speed:.1f} files/s" if speed >= 1 else f"{1 / speed:.0f} s/file", style="progress.data.speed")


class IngestBar:
    """The ingest progress callback: one bar in files, whose total (known once the folder is walked) never moves.

    Why files, not chunks: the chunk total grows as files are read (a folder is read and embedded in batches of
    EMBED_BATCH_CHUNKS), so a chunk bar's total and ETA would jump. Why it still moves while embedding, where the
    time goes (30 files read in a second, then 75 s of model loading and embedding, measured here): "embedding"
    reports carry files_progress, the files committed plus the batch's files in the share of its chunks
    embedded; the chunks embedded of those read so far ride along as text. A file read is not progress: the bar
    advances on embedding, writing (committed) and done, never back."""

    MOVING_STAGES = ("embedding", "writing", "reindexing", "done")

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("files", total=None, chunks="", current="")
        self.completed = 0.0

    def __call__(self, p: Any) -> None:
        fields: dict[str, Any] = {"total": p.files_total or None,
                                  "chunks": f"{p.stage}: {p.chunks_done}/{p.chunks_total} chunks",
                                  "current": p.current[-40:]}
        if p.stage in self.MOVING_STAGES:
            done = p.files_progress if p.stage == "embedding" else p.files_done
            self.completed = fields["completed"] = max(done, self.completed)
        self.progress.update(self.task, **fields)


@contextmanager
def ingest_progress(state: CliState, *, force_terminal: bool | None = None) -> Iterator[IngestBar | None]:
    """A progress callback for ingest_path/reindex_collection on a terminal; None under --json, -q or a pipe."""
    console = Console(stderr=True, highlight=False, force_terminal=force_terminal)
    if state.json or state.quiet or not console.is_terminal:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
                  TimeRemainingColumn(), TextColumn("[dim]{task.fields[chunks]}  {task.fields[current]}"),
                  console=console, transient=True) as progress:
        yield IngestBar(progress)


def paged(human: Callable[[Console, Any], None], items: str) -> Callable[[Console, Any], None]:
    """`human` plus, when more pages follow, a footer with the count and the cursor of the next page."""

    def render(console: Console, result: Any) -> None:
        human(console, result)
        if result.next_cursor:
            console.print(f"[dim]{len(getattr(result, items))} of {result.total} shown; for the next page, repeat "
                          f"the command with[/dim] --cursor {result.next_cursor}", highlight=False)

    return render


# -- human renderers: one per result model ------------------------------------------------------

def _fields(console: Console, title: str, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False, title_justify="left", title_style="bold")
    table.add_column(style="cyan", no_wrap=True)
    table.add_column()
    for key, value in rows:
        if isinstance(value, list):
            value = ", ".join(map(str, value)) or "-"
        table.add_row(key, escape("-" if value is None or value == "" else str(value)))
    console.print(table)


def collection_info(console: Console, info: Any) -> None:
    _fields(console, f"Collection {info.name}", [
        ("type", info.type), ("description", info.description), ("projects", info.projects),
        ("documents", info.document_count), ("chunks", info.chunk_count),
        ("embedding model", info.embedding_model), ("dimension", info.embedding_dimension),
        ("created", info.created_at)])


def collection_list(console: Console, result: Any) -> None:
    if not result.collections:
        console.print("No collections. Create one with `research-agent collections create NAME`.")
        return
    table = Table("name", "type", "docs", "chunks", "projects", "description")
    for col in result.collections:
        table.add_row(escape(col.name), col.type, str(col.document_count), str(col.chunk_count),
                      escape(", ".join(col.projects)), escape(col.description))
    console.print(table)


def deleted(console: Console, result: Any) -> None:
    extra = f" ({plural(result.chunks_removed, 'chunk')} removed)" if result.chunks_removed else ""
    console.print(f"Deleted {result.kind} [bold]{escape(result.deleted)}[/bold]{extra}.")


def project_info(console: Console, info: Any) -> None:
    _fields(console, f"Project {info.name}", [
        ("description", info.description), ("collections", info.collections),
        ("default collections", info.default_collections), ("created", info.created_at)])


def project_list(console: Console, result: Any) -> None:
    if not result.projects:
        console.print("No projects. Create one with `research-agent projects create NAME`.")
        return
    table = Table("name", "collections", "defaults", "description")
    for p in result.projects:
        table.add_row(escape(p.name), escape(", ".join(p.collections)), escape(", ".join(p.default_collections)),
                      escape(p.description))
    console.print(table)


def ingest_report(console: Console, r: Any) -> None:
    console.print(f"[bold]{escape(r.collection)}[/bold]: {r.added} added, {r.updated} updated, "
                  f"{r.unchanged} unchanged, {r.removed} removed; {plural(r.chunks_written, 'chunk')} "
                  f"written from {plural(r.files_seen, 'file')} in {r.seconds:.1f} s.")
    groups = (("skipped", "yellow", r.skipped), ("failed", "red", r.failed),
              ("ingested with warnings", "yellow", r.warnings), ("kept, not pruned", "cyan", r.not_pruned))
    for label, style, problems in groups:
        if problems:
            table = Table("path", "reason", title=f"{len(problems)} {label}", title_justify="left",
                          title_style=style)
            for p in problems:
                table.add_row(escape(p.path), escape(p.reason))
            console.print(table)
    if r.removed_documents:
        console.print("Removed: " + ", ".join(escape(d) for d in r.removed_documents))


def document_list(console: Console, result: Any) -> None:
    if not result.documents:
        console.print(f"No documents in {escape(result.collection)}.")
        return
    table = Table(title=result.collection, title_justify="left", title_style="bold")
    # Document names are what `kb remove-document` takes: wrap them, never cut them.
    table.add_column("document", overflow="fold")
    for name in ("title", "kind", "chunks", "updated"):
        table.add_column(name)
    for d in result.documents:
        table.add_row(escape(d.document), escape(d.title), d.kind, str(d.chunk_count),
                      (d.updated_at or "")[:16].replace("T", " "))
    console.print(table)


def augment_result(console: Console, r: Any) -> None:
    verb = {"added": "Added", "updated": "Updated"}.get(r.status, "Already stored:")
    console.print(f"{verb} [bold]{escape(r.title)}[/bold] in {escape(r.collection)} as {escape(r.document)} "
                  f"({plural(r.chunks_written, 'chunk')} written).")


def _snippet(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def hit_location(hit: Any, path: str | None, cwd: Path | None = None) -> str:
    """Where a hit is, for an editor: `docs/guide.md:42` (its file relative to `cwd` when inside it, else
    absolute, and its first line); a research or note hit shows its document key (`kb get KEY:42` reads it);
    a PDF hit its page. A record (`kb add-records`) shows its document key `tools.jsonl#search_web`, what
    `kb get` takes: its file alone names every record of the file (an "ambiguous" error), and its lines are
    the record's text, not the file's."""
    where = hit.source_document
    if hit.metadata.get("kind") == "record":
        return where
    if path:
        cwd = cwd or Path.cwd().resolve()
        where = Path(path).relative_to(cwd).as_posix() if Path(path).is_relative_to(cwd) else path
    line, page = hit.line_start, hit.page
    if isinstance(line, int):
        return f"{where}:{line}"
    return f"{where} (page {page})" if isinstance(page, int) else where


def explain_line(e: dict[str, Any]) -> str:
    """`dense #3 0.61 · keyword #1 12.4 · fused 0.83 (dense weight 0.57) · rerank – · matched content: retry;
    title: retry`: a hit's `explain` object on one line (– for a side that did not see the hit; the dense
    weight fusion used, in hybrid mode only)."""
    def side(name: str) -> str:
        rank, score = e.get(f"{name}_rank"), e.get(name)
        return " ".join([name, *([f"#{rank}"] if rank else []), "–" if score is None else f"{score:.3g}"])

    fused, rerank = e.get("fused"), e.get("rerank")
    matched = "; ".join(f"{field}: {', '.join(words)}" for field, words in (e.get("matched") or {}).items() if words)
    weight = e.get("dense_weight")
    fused_text = "–" if fused is None else f"{fused:.3g}"
    fused_text += "" if weight is None else f" (dense weight {weight:.2f})"
    return " · ".join([side("dense"), side("keyword"), f"fused {fused_text}",
                       f"rerank {'–' if rerank is None else f'{rerank:.3g}'}", f"matched {matched or '–'}"])


def query_result(console: Console, r: Any) -> None:
    warn(r.warnings)
    # No warning when reranking was turned off (--no-rerank, rerank: false): the user asked for it. A reranker
    # that was wanted but could not load arrives as one of r.warnings.
    if not r.results:
        console.print(f"No results in {escape(', '.join(r.collections))}.")
    cwd = Path.cwd().resolve()
    for rank, hit in enumerate(r.results, start=1):
        path = hit.path
        console.print(f"[bold]{rank}.[/bold] [green]{hit.relevance_score:.3f}[/green] {escape(hit.relevance_label)}  "
                      f"[cyan]{escape(hit_location(hit, path, cwd))}[/cyan]"
                      + (f"  [dim]{escape(hit.header_path)}[/dim]" if hit.header_path else ""))
        console.print(f"   {escape(_snippet(hit.content))}")
        if hit.explain:
            console.print(f"   [dim]{escape(explain_line(hit.explain))}[/dim]")
    refinement = r.query_refinement
    style = "dim" if refinement.status == "optimal" else "yellow"
    console.print(f"[{style}]{escape(refinement.message)}[/{style}]")
    for suggestion in refinement.suggestions:
        console.print(f"[{style}]  - {escape(suggestion)}[/{style}]")


def status_report(console: Console, s: Any) -> None:
    if s.reranker_available is None:
        reranker = "not loaded yet (use --check-reranker to try it)"
    elif s.reranker_available:
        reranker = "available" + (f", {s.reranker_precision}" if s.reranker_precision else "")
    else:
        reranker = f"UNAVAILABLE: {s.reranker_error} (queries are not reranked)"
    store = s.store_location + ("" if s.store_reachable else f"  UNREACHABLE: {s.store_error}")
    _fields(
        console,
        f"research-agent {s.version}",
        [
            ("store", f"{s.store_kind}: {store}"),
            (
                "embedding model",
                f"{s.embedding_model} ({s.embedding_backend}, {'loaded' if s.embedding_loaded else 'not loaded'})",
            ),
            ("reranker model", f"{s.reranker_model} ({s.reranker_backend})"),
            ("reranker", reranker),
            ("device", s.device),
            ("collections", s.collections),
            ("documents", s.documents),
            ("chunks", s.chunks),
            ("projects", s.projects),
        ],
    )


def doctor_report(console: Console, r: Any) -> None:
    from research_agent.ops.doctor import REPAIR_ADVICE

    table = Table(title="Store check", title_justify="left", title_style="bold")
    for col in ("collection", "documents", "chunks", "orphan chunks", "incomplete documents", "unfinished writes"):
        table.add_column(col)
    for ch in r.collections:
        table.add_row(escape(ch.collection), str(ch.documents), str(ch.chunks), str(ch.orphan_chunks),
                      escape(", ".join(ch.incomplete_documents) or "-"), str(ch.unfinished_writes))
    console.print(table)
    for item in r.leftovers:
        console.print(f"[yellow]leftover: {escape(item)}[/yellow]")
    for action in r.actions:
        console.print(f"[green]repaired: {escape(action)}[/green]")
    for lease in getattr(r, "reindexes", []):
        console.print(f"[yellow]reindex in progress: {escape(lease.summary())}[/yellow]")
    for claim in getattr(r, "reindex_claims", []):
        console.print(f"[yellow]reindex claim: {escape(claim.summary())}[/yellow]")
    if r.healthy:
        console.print("[green]healthy[/green]")
    elif r.repaired or REPAIR_ADVICE not in r.advice:
        console.print("[red]problems left: see the notes[/red]")  # another repair would not fix them
    else:
        console.print("[red]problems found: run `research-agent doctor --repair`[/red]")


def document_content(console: Console, d: Any) -> None:
    """The title line, notes, then the lines as `cat -n` numbers them (a tab after the number); `N~` marks an
    approximate line, `N…` (or `N-M…`) lines no chunk stores (--json gives each span's reason)."""
    console.print(f"[bold]{escape(d.title)}[/bold]  [dim]{escape(d.document)} ({d.kind}, {escape(d.source)})[/dim]")
    legend = [f"{mark} {what}" for mark, what, spans in (
        ("N…", "lines no chunk stores (blank lines, front matter or markup)", d.missing),
        ("N~", "lines the chunks give only approximately (see --json: inexact)", d.inexact)) if spans]
    for note in [*d.notes, *legend]:
        console.print(f"[dim]note: {escape(note)}[/dim]")
    if d.line_end >= d.line_start >= 1:
        console.file.write(printable(numbered_lines(d)))  # as stored, controls visible: no markup, tab expansion
        console.file.flush()


def numbered_lines(d: Any) -> str:
    """`d.line_start`..`d.line_end` of a DocumentContent, one numbered line each, a missing run as one `N-M…`."""
    text = {line.n: line.text for line in d.lines}
    approximate = {n for span in d.inexact for n in range(span.line_start, span.line_end + 1)}
    missing = {span.line_start: span.line_end for span in d.missing}
    out: list[str] = []
    n = d.line_start
    while n <= d.line_end:
        if n in missing:
            end = missing[n]
            out.append(f"{n if end == n else f'{n}-{end}':>6}…")
            n = end + 1
            continue
        out.append(f"{n:>6}{'~' if n in approximate else ''}\t{text.get(n, '')}")
        n += 1
    return "".join(line + "\n" for line in out)
