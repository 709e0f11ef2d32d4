"""Recent query history, kept in the store's registry (so a Chroma server shares it) and bounded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from research_agent.catalog.collections import now_iso
from research_agent.storage.registry import HISTORY, history_key

if TYPE_CHECKING:
    from research_agent.container import Container

RECORD = HISTORY
#: Oldest entries beyond this many are dropped on the next write.
MAX_ENTRIES = 200
_QUERY_CHARS = 500


def record_query(c: Container, query: str, collections: list[str] | None, n_results: int, *, mode: str | None = None,
                 source: str = "mcp") -> None:
    """Append one query to the history and drop the oldest entries beyond MAX_ENTRIES.

    Takes the store's write lock (embedded stores serialize writers across processes), so callers on a
    latency-sensitive path should run it off that path.
    """
    rid = history_key()  # sorts in time order
    entry = {"query": str(query)[:_QUERY_CHARS], "collections": list(collections or []), "n_results": int(n_results),
             "mode": mode, "source": source, "at": now_iso()}
    with c.store.write_lock():
        c.store.registry_put({rid: entry}, RECORD)
        ids = sorted(c.store.registry_find(RECORD))
        if len(ids) > MAX_ENTRIES:
            c.store.registry_delete(ids[:len(ids) - MAX_ENTRIES])


def recent_queries(c: Container, limit: int = 50) -> list[dict[str, Any]]:
    """The newest `limit` queries, newest first."""
    c.store.refresh()
    records = c.store.registry_find(RECORD)
    return [records[rid] for rid in sorted(records, reverse=True)[:max(0, int(limit))]]


__all__ = ["MAX_ENTRIES", "record_query", "recent_queries"]
