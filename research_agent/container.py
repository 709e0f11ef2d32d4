"""The composition root: settings, store, embedder and reranker, each built once and lazily."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from research_agent.config import Settings, load_settings

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # annotations only: these pull in Chroma, torch or numpy, kept off `--help` and the MCP handshake
    from research_agent.embeddings import Embedder
    from research_agent.rerank import Reranker
    from research_agent.storage.store import Store


class Container:
    """What every service function receives; nothing else reads settings or the environment."""

    def __init__(self, settings: Settings, one_shot: bool = False) -> None:
        self.settings = settings
        # A one-shot process (a CLI command) pays every import once per call, a server once per life: the
        # reranker picks its backend by this (rerank.Reranker._numpy_model).
        self.one_shot = one_shot
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._opening: threading.Thread | None = None

    @property
    def store(self) -> Store:
        # Locked: MCP tool calls run in worker threads, and two first calls each building a Store made two
        # Chroma clients on one path at once (Chroma's process-wide system cache broke: -32000s under load).
        if self._store is None:
            with self._store_lock:
                if self._store is None:
                    from research_agent.storage.store import Store

                    self._store = Store(self.settings)
        return self._store

    @property
    def embedder(self) -> Embedder:
        from research_agent.embeddings import load_embedder

        return load_embedder(self.settings)

    @property
    def embedder_loaded(self) -> bool:
        from research_agent.embeddings import is_loaded

        return is_loaded(self.settings)

    @property
    def reranker(self) -> Reranker:
        from research_agent.rerank import get_reranker

        return get_reranker(self.settings, one_shot=self.one_shot)

    def open_store_in_background(self) -> None:
        """Start opening the store (importing chromadb, ~0.4-0.5 s of a 10k-chunk CLI query, and its client) in a
        thread, while this one loads the models (`warm_query`); `wait_for_store` before the first read. A failure
        is not reported there: the reader's own use of the store raises it, coded, in its thread. For a Chroma server
        the thread only imports chromadb: connecting twice to one that does not answer would wait twice."""
        if self._opening is not None or self._store is not None:
            return
        # numpy is what both sides import (chromadb here, the query encoder in `warm_query`): imported in this
        # thread first, never raced, as two threads importing numpy at once can fail with "partially
        # initialized module" ImportErrors (mcp/lifespan.py Warmup).
        import numpy  # noqa: F401

        self._opening = threading.Thread(target=self._open_quietly, name="store-open", daemon=True)
        self._opening.start()

    def _open_quietly(self) -> None:
        try:
            if self.settings.server_mode:
                from research_agent.storage.store import import_client_library

                import_client_library()  # the slow part; the reader connects
            else:
                self.store.client  # noqa: B018 - connects
        except Exception:
            log.debug("opening the store ahead of the query failed; the query reports it", exc_info=True)

    def wait_for_store(self) -> None:
        """Join `open_store_in_background`'s thread: the read session that follows then compares the store's
        generation with the one the client was opened at (a commit in between reopens it)."""
        if self._opening is not None:
            self._opening.join()
            self._opening = None

    def warm_query(self, query: str, mode: str, rerank: bool) -> None:
        """Load what the query will use (the torch-free query encoder and its vector, a reranker on disk) before
        the search asks, so it overlaps `open_store_in_background`. Failures are left to the search, which reports
        them as before; models that could take seconds to fail (torch, a hub probe) are not tried here."""
        from research_agent import embeddings

        try:
            text = query.strip()
            if (mode != "keyword" and embeddings.loads_without_torch(self.settings)
                    and 0 < len(text) <= self.settings.max_query_chars):
                self.embedder.embed_query(text)
            if rerank and self.settings.rerank:
                self.reranker.warm()
        except Exception:
            log.debug("warming the query models failed; the query reports it", exc_info=True)

    def close(self) -> None:
        self.wait_for_store()
        if self._store is not None:
            self._store.close()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (test runners and servers swap it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(settings: Settings) -> None:
    """Logs go to stderr (stdout belongs to results and JSON-RPC), optionally to a file too."""
    level = settings.log_level.upper()
    handlers: list[logging.Handler] = [_StderrHandler()]
    if settings.log_file:
        handlers.append(logging.FileHandler(settings.log_file))
    for h in handlers:
        # Handler-level too: some libraries (bm25s) set their own logger to DEBUG when imported.
        h.setLevel(level)
    logging.basicConfig(level=level, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("chromadb", "httpx", "sentence_transformers", "transformers", "urllib3", "filelock", "bm25s"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def build_container(config_file: Path | str | None = None, one_shot: bool = False, **overrides: Any) -> Container:
    """Settings from every layer (overrides are CLI flags; None = not given), then the container."""
    settings = load_settings(config_file, **overrides)
    configure_logging(settings)
    return Container(settings, one_shot=one_shot)
