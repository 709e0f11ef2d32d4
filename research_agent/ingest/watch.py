"""Watch: keep a collection in sync with a folder until interrupted (watchdog, debounced)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from research_agent.ingest.service import IngestReport, ingest_path

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)


def watch_folder(
    c: Container,
    path: str | Path,
    collection: str,
    *,
    recursive: bool = True,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    debounce: float = 1.0,
    on_sync: Callable[[IngestReport], None] | None = None,
    stop: threading.Event | None = None,
    allowed_roots: list[Path] | None = None,
) -> None:
    """Sync once, then again `debounce` seconds after the last change, until `stop` is set (or Ctrl-C)."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    include, exclude = list(include), list(exclude)
    stop = stop or threading.Event()
    changed = threading.Event()
    root = Path(path)

    def sync() -> None:
        # ingest_path is incremental: unchanged files cost a hash; --prune drops deleted ones.
        report = ingest_path(c, root, collection, recursive=recursive, include=include, exclude=exclude,
                             prune=True, allowed_roots=allowed_roots)
        if on_sync:
            on_sync(report)

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:  # noqa: ANN001
            if event.event_type not in ("opened", "closed_no_write") and ".git" not in Path(event.src_path).parts:
                changed.set()

    # The observer starts before the first sync: a file written while that sync runs (it can take minutes)
    # still sets `changed`, where starting it afterwards missed such a file until the next unrelated change.
    observer = Observer()
    observer.schedule(Handler(), str(root), recursive=recursive)
    observer.start()
    try:
        # Hostile entries (FIFOs, symlink loops, undecodable names, unreadable folders) are per-file problems
        # in the report; only a run-level error (unknown collection, path outside the roots) ends the watch.
        sync()
        while not stop.is_set():
            if changed.wait(timeout=0.2):
                # Debounce: wait until the folder has been quiet for `debounce` seconds.
                while changed.is_set() and not stop.is_set():
                    changed.clear()
                    stop.wait(debounce)
                if not stop.is_set():
                    try:
                        sync()
                    except Exception as exc:  # one failed sync must not end the watch
                        log.error("sync of %s failed: %s", root, exc)
    finally:
        observer.stop()
        observer.join(timeout=5)
