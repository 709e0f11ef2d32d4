"""`research-agent kb ...`: put documents and research into a collection, list and remove them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer

from research_agent.cli import render
from research_agent.cli.collections import CURSOR, LIMIT, CollectionType, create as create_collection
from research_agent.cli.inputs import read_stdin
from research_agent.cli.state import get_state

app = typer.Typer(help="Add, list, remove and reindex the documents in a collection.", no_args_is_help=True)

COLLECTION = typer.Option(..., "--collection", help="Target collection.")
# The text of research and notes: exactly one of --content, --file F and `-` (stdin).
STDIN = typer.Argument(None, metavar="-", help="Read the content from stdin.", show_default=False)
CONTENT = typer.Option(None, "--content", help="The text (Markdown).")
CONTENT_FILE = typer.Option(None, "--file", help="Read the text from this file.")


@app.command("add-document")
def add_document(
    ctx: typer.Context,
    path: Path = typer.Argument(..., metavar="PATH", help="File to ingest."),
    collection: str = COLLECTION,
    title: Optional[str] = typer.Option(None, "--title", help="Title (default: from the document)."),
) -> None:
    """Ingest one file (unchanged files are skipped)."""
    from research_agent.ingest import ingest_path

    if path.is_dir():
        raise typer.BadParameter(f"{path} is a folder; use `kb add-folder`", param_hint="'PATH'")
    state = get_state(ctx)
    with render.ingest_progress(state) as progress:
        report = ingest_path(state.container(), path, collection, title=title, progress=progress)
    render.emit(state, report, render.ingest_report)


@app.command("add-folder")
def add_folder(
    ctx: typer.Context,
    path: Path = typer.Argument(..., metavar="PATH", help="Folder to ingest."),
    collection: str = COLLECTION,
    recursive: bool = typer.Option(True, "--recursive/--no-recursive", help="Descend into subfolders."),
    include: list[str] = typer.Option(
        [], "--include", metavar="GLOB", help="Only files matching this glob (repeatable)."
    ),
    exclude: list[str] = typer.Option(
        [], "--exclude", metavar="GLOB", help="Skip files matching this glob (repeatable)."
    ),
    prune: bool = typer.Option(False, "--prune", help="Remove documents whose files are gone from the folder."),
    strict: bool = typer.Option(False, "--strict", help="Fail (exit 5) if any file is skipped or fails."),
    create: bool = typer.Option(False, "--create", help="Create the collection if it does not exist."),
    type: Optional[CollectionType] = typer.Option(None, "--type", show_default=False,
                                                  help="With --create: the new collection's type (default: "
                                                       "project-specific)."),
    description: Optional[str] = typer.Option(None, "--description",
                                              help="With --create: what the new collection holds."),
) -> None:
    """Ingest a folder: new and changed files are (re)indexed, unchanged ones skipped.

    Examples:

      research-agent kb add-folder docs/ --collection project-docs --include "*.md" --prune

      research-agent kb add-folder docs/ --collection project-docs --create --type fundamental
    """
    from research_agent.ingest import ingest_path

    if path.is_file():
        raise typer.BadParameter(f"{path} is a file; use `kb add-document`", param_hint="'PATH'")
    if (type is not None or description is not None) and not create:
        # Without --create they were ignored silently: an existing collection keeps its own type.
        raise typer.BadParameter("--type and --description describe a new collection; pass --create too",
                                 param_hint="'--create'")
    state = get_state(ctx)
    c = state.container()
    if create:
        from research_agent.ingest.prepare import require_existing

        require_existing(path, None)  # a typo left an empty collection behind (exit 5 after creating it)
        create_collection(state, collection, type=type, description=description, exist_ok=True)
    with render.ingest_progress(state) as progress, _suggest_create(c, collection, create):
        report = ingest_path(c, path, collection, recursive=recursive, include=include,
                             exclude=exclude, prune=prune, strict=strict, progress=progress)
    render.emit(state, report, render.ingest_report)


@contextmanager
def _suggest_create(c: Any, collection: str, create: bool) -> Iterator[None]:
    """A missing collection's error also names --create, the one-step way for a script."""
    from research_agent.errors import CollectionError

    try:
        yield
    except CollectionError as exc:
        if not create and not c.store.has_collection(collection):
            exc.data["guidance"] = f"Pass --create to create {collection!r} first. {exc.data['guidance']}"
        raise


def _research_text(content: str | None, file: Path | None, stdin: str | None) -> str:
    """Exactly one of --content, --file F and `-` (stdin; also `--file -`)."""
    from research_agent.errors import DocumentError

    given = [x for x in (content, file, stdin) if x is not None]
    if len(given) != 1:
        raise typer.BadParameter("pass exactly one of --content TEXT, --file F or - (stdin)")
    if stdin is not None and stdin != "-":
        raise typer.BadParameter(f"unexpected argument {stdin!r}; only - (read stdin) is accepted",
                                 param_hint="'-'")
    if stdin is not None or str(file) == "-":
        return read_stdin()
    if file is not None:
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DocumentError(f"Cannot read {file}: {getattr(exc, 'strerror', None) or exc}",
                                guidance="Pass a readable UTF-8 text file to --file.", path=str(file)) from None
    return content  # type: ignore[return-value]


@app.command("add-research")
def add_research(ctx: typer.Context,
                 stdin: Optional[str] = STDIN,
                 collection: str = COLLECTION,
                 source: str = typer.Option(..., "--source", help="Where it came from: URL or citation."),
                 title: Optional[str] = typer.Option(None, "--title", help="Title (default: first heading or source)."),
                 content: Optional[str] = CONTENT,
                 file: Optional[Path] = CONTENT_FILE) -> None:
    """Store research findings (Markdown) with their source."""
    from research_agent.catalog.notes import add_research as add

    state = get_state(ctx)
    text = _research_text(content, file, stdin)
    render.emit(state, add(state.container(), collection, text, source, title=title), render.augment_result)


@app.command("list-documents")
def list_documents(ctx: typer.Context, collection: str = COLLECTION, limit: Optional[int] = LIMIT,
                   cursor: Optional[str] = CURSOR) -> None:
    """List the documents in a collection."""
    from research_agent.ingest import list_documents as list_docs

    state = get_state(ctx)
    render.emit(state, state.read(list_docs, collection, limit=limit, cursor=cursor),
                render.paged(render.document_list, "documents"))


@app.command("remove-document")
def remove_document(
    ctx: typer.Context,
    document: str = typer.Argument(..., metavar="DOC", help="Document name (see list-documents) or file path."),
    collection: str = COLLECTION,
) -> None:
    """Remove a document and its chunks from a collection."""
    from research_agent.ingest import remove_document as remove

    state = get_state(ctx)
    render.emit(state, remove(state.container(), collection, document), render.deleted)


@app.command("prune")
def prune(ctx: typer.Context, collection: str = COLLECTION,
          under: Optional[Path] = typer.Option(None, "--under", metavar="PATH",
                                               help="Only documents ingested from this folder (it may no longer "
                                                    "exist); confirms its files are gone for good."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed; remove nothing.")) -> None:
    """Remove documents whose files are gone (after moving or renaming an ingested folder).

    Never on an unreadable file or folder; a drive that looks unmounted is kept unless --under names it."""
    from research_agent.ingest import prune_missing

    state = get_state(ctx)
    report = prune_missing(state.container(), collection, under, dry_run=dry_run)
    render.emit(state, report, render.ingest_report)
    if dry_run and not state.json:
        render.stderr().print("dry run: nothing was removed")


@app.command("reindex")
def reindex(ctx: typer.Context, collection: str = COLLECTION) -> None:
    """Re-embed every chunk with the configured embedding model (after changing it)."""
    from research_agent.ingest import reindex_collection

    state = get_state(ctx)
    with render.ingest_progress(state) as progress:
        report = reindex_collection(state.container(), collection, progress=progress)
    render.emit(state, report, render.ingest_report)


@app.command("add-note")
def add_note(ctx: typer.Context,
             stdin: Optional[str] = STDIN,
             collection: str = COLLECTION,
             title: str = typer.Option(..., "--title", help="The note's title."),
             source: Optional[str] = typer.Option(None, "--source", help="Where it came from (default: the note id)."),
             content: Optional[str] = CONTENT,
             file: Optional[Path] = CONTENT_FILE) -> None:
    """Add a note; `kb update-note` replaces it in place later."""
    from research_agent.catalog.notes import add_note as add

    state = get_state(ctx)
    text = _research_text(content, file, stdin)
    render.emit(state, add(state.container(), collection, text, title, source=source), render.augment_result)


@app.command("update-note")
def update_note(
    ctx: typer.Context,
    document: str = typer.Argument(..., metavar="DOC", help="The note id (see add-note or list-documents)."),
    stdin: Optional[str] = STDIN,
    collection: str = COLLECTION,
    title: Optional[str] = typer.Option(None, "--title", help="New title (default: keep)."),
    content: Optional[str] = CONTENT,
    file: Optional[Path] = CONTENT_FILE,
) -> None:
    """Replace a note's content in place."""
    from research_agent.catalog.notes import update_note as update

    state = get_state(ctx)
    text = _research_text(content, file, stdin)
    render.emit(state, update(state.container(), collection, document, text, title=title), render.augment_result)


@app.command("get")
def get(ctx: typer.Context,
        document: str = typer.Argument(..., metavar="DOC", help="Document id (see list-documents) or file path; "
                                                                "DOC:10-20 or DOC:42 reads those lines."),
        collection: str = COLLECTION,
        lines: Optional[str] = typer.Option(None, "--lines", metavar="N-M",
                                            help="Only these lines: 42, 10-20 or 10- (to the end).")) -> None:
    """Print a document's text with line numbers, reassembled from its chunks.

    Numbers are the file's lines, front matter counted (research and notes: their stored text's lines).

    PDF, HTML and DOCX: the lines of the stored text. A range past the end stops at the last line.

    `N…` marks lines no chunk stores (blank lines, front matter, markup); `N~` a line given approximately.

    Examples:

      research-agent kb get docs/guide.md --collection project-docs --lines 10-20

      research-agent kb get docs/guide.md:42 --collection project-docs
    """
    from research_agent.ingest.documents import get_document, parse_line_range

    start, end = parse_line_range(lines) if lines is not None else (None, None)
    state = get_state(ctx)
    render.emit(state, state.read(get_document, collection, document, line_start=start, line_end=end),
                render.document_content)


@app.command("watch")
def watch(ctx: typer.Context, path: Path = typer.Argument(..., metavar="PATH", help="Folder to keep in sync."),
          collection: str = COLLECTION,
          recursive: bool = typer.Option(True, "--recursive/--no-recursive", help="Descend into subfolders."),
          include: list[str] = typer.Option([], "--include", metavar="GLOB", help="Only files matching this glob."),
          exclude: list[str] = typer.Option([], "--exclude", metavar="GLOB", help="Skip files matching this glob."),
          debounce: float = typer.Option(1.0, "--debounce", help="Seconds of quiet before a sync.")) -> None:
    """Keep a collection in sync with a folder until Ctrl-C or SIGTERM (created, changed and deleted files).

    Examples:

      research-agent kb watch docs/ --collection project-docs --include "*.md"
    """
    import signal
    import threading

    from research_agent.ingest.watch import watch_folder

    if not path.is_dir():
        raise typer.BadParameter(f"{path} is not a folder", param_hint="'PATH'")
    state = get_state(ctx)
    # The first Ctrl-C (or SIGTERM) stops the watch after the sync in progress, if any; a second one interrupts
    # at once. A KeyboardInterrupt raised at an arbitrary point (inside a lock's `with`, say) can hang the exit.
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    # Said before the first sync, which may take minutes: a silent terminal looks hung.
    render.stderr().print(f"Watching {path.resolve()} for collection {collection} (a sync now, then after each "
                          "change); press Ctrl-C to stop.", markup=False, highlight=False)
    try:
        watch_folder(state.container(), path, collection, recursive=recursive, include=include, exclude=exclude,
                     debounce=debounce, on_sync=lambda report: render.emit(state, report, render.ingest_report),
                     stop=stop)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    render.stderr().print("stopped watching")
