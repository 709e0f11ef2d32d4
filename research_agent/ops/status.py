"""Status: what research-agent is running on (store, models, counts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from research_agent import __version__

if TYPE_CHECKING:
    from research_agent.container import Container


class StatusReport(BaseModel):
    version: str
    store_kind: str
    store_location: str
    store_reachable: bool
    store_exists: bool = True  # False: nothing at an embedded store's path yet (reads never create it)
    store_error: str | None = None
    embedding_model: str
    embedding_backend: str
    embedding_loaded: bool
    reranker_model: str
    reranker_backend: str
    reranker_loaded: bool
    reranker_available: bool | None
    reranker_error: str | None
    reranker_precision: str | None = None  # float32 | bfloat16 once loaded (rerank_precision=auto decides)
    device: str
    collections: int = 0
    documents: int = 0
    chunks: int = 0
    projects: int = 0


def get_status(c: Container, check_reranker: bool = False) -> StatusReport:
    """Counts from the store; with check_reranker the reranker is loaded to report whether it works."""
    s = c.settings
    rr = c.reranker
    if check_reranker:
        rr.load()
    available, error = rr.available, rr.error
    if available is None:
        # Without loading anything (no torch): a hub model that is not cached fails if downloads are off or
        # the hub does not answer a probe of at most embeddings.HUB_PROBE_TIMEOUT (1 s, remembered).
        from research_agent.embeddings import resolve_model
        from research_agent.errors import ConfigError

        try:
            resolve_model(s.reranker_model, s)
        except ConfigError as exc:
            available, error = False, exc.message
    report = StatusReport(
        version=__version__, store_kind=c.store.kind, store_location=c.store.location, store_reachable=True,
        store_exists=c.store.exists,
        embedding_model=s.embedding_model, embedding_backend=s.embedding_backend, embedding_loaded=c.embedder_loaded,
        reranker_model=s.reranker_model, reranker_backend=s.reranker_backend, reranker_loaded=rr.loaded,
        reranker_available=available, reranker_error=error, reranker_precision=rr.precision, device=s.device,
    )
    try:
        c.store.refresh()
        cols = c.store.list_collections()
        docs = c.store.registry_find("document")
        report.collections = len(cols)
        report.documents = len(docs)
        report.chunks = sum(int(d.get("chunk_count", 0)) for d in docs.values())
        report.projects = len(c.store.registry_find("project"))
    except Exception as exc:  # status must answer even when the store does not
        from research_agent.errors import as_research_agent_error

        report.store_reachable = False
        report.store_error = as_research_agent_error(exc).message
    return report
