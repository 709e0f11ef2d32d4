"""The composition root: settings, store, embedder and reranker, each built once and lazily."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from research_agent.config import Settings, load_settings

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

    def close(self) -> None:
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
