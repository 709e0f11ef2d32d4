"""Reading a Chroma collection page by page, and which chunks a reader may see.

The one paging loop: Chroma's `get` without a limit loads a whole collection at once (and SQLite refuses a
`get` by more ids than its variable limit), so every full read goes PAGE records at a time. It was written
four times (keyword index, node index, doctor, registry) before this module. A where-scan keeps its place by
the ids it read, not by offset alone, so another process's deletes meanwhile make it skip nothing (`_scan`).

The visibility rule: a chunk is visible only if its document's manifest names its content hash. A write
puts a document's new chunks in before it flips the manifest and deletes the old ones after, so a reader
that applies this rule never sees half of a new version nor a stale one (docs/architecture.md,
"Consistency").
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from research_agent.errors import StoreUnavailableError

# Records per `get`: 5,000 chunks with documents and metadata are ~10-20 MB; one page of ids stays far below
# SQLite's 32,766 bound variables.
PAGE = 5000
#: Records each where-scan page re-reads of the page before (1 in 50: 100 of 5,000, ~2% more records read) to
#: find where the last page ended: up to this many deletes behind the scan per page cost nothing more; more
#: cost one more `get` (`_resume`).
OVERLAP_DIVISOR = 50


def pages(col: Any, include: Sequence[str], *, where: dict[str, Any] | None = None,
          ids: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every record of `col` (only those matching `where`, or only `ids`), as Chroma `get` results of PAGE."""
    if ids is not None:
        for start in range(0, len(ids), PAGE):
            yield col.get(ids=list(ids[start:start + PAGE]), include=list(include))
        return
    yield from _scan(col, list(include), where)


def _scan(col: Any, include: list[str], where: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """A where-scan by offset that skips no record present for the whole scan, whatever others delete.

    Why not plain offsets: Chroma (1.5.9, embedded and `chroma run`) returns `get` results in insertion order
    (an upsert of an existing id keeps its place; a new record, or a deleted and re-added id, goes last), so a
    delete of a record already read moves every later one a place down and the next offset skipped one record
    per delete: through a server, another machine's writer deleting old chunk versions or manifests made the
    keyword index miss documents for good (finding 1). Inserts only append, so they never shift what is left.
    Each page therefore starts a few records (the overlap) before where the last one ended and is cut after
    the last record of the previous pages it holds; if it holds none (more deletes than the overlap), `_resume`
    looks further back. Each record is yielded once, in Chroma's order."""
    overlap = max(1, PAGE // OVERLAP_DIVISOR)
    res = col.get(where=where, include=include, limit=PAGE, offset=0)
    end = len(res["ids"])
    yield res
    before, read = [], res["ids"]
    while len(read) == PAGE:  # else that page was the last: nothing came after it when it was read
        # Anchors: the last two pages read (<= 2 x PAGE ids), so losing the place takes 2 x PAGE deletes.
        start, got, fresh = _resume(col, include, where, end - overlap, before + read)
        before, read = read, got
        if fresh["ids"]:
            yield fresh
        end = start + len(read)


def _resume(col: Any, include: list[str], where: dict[str, Any] | None, offset: int, previous: list[str]
            ) -> tuple[int, list[str], dict[str, Any]]:
    """(offset read, ids of the page read, its records after the last surviving one of `previous`): read from
    `offset`, then a page further back each time none of `previous` is in the page (windows overlap by one).
    Raises ChangedMeanwhile when no record of `previous` survives (all deleted meanwhile: nothing then says
    where the scan stopped)."""
    known = set(previous)
    while True:
        res = col.get(where=where, include=include, limit=PAGE, offset=offset)
        got = res["ids"]
        last = next((i for i in range(len(got) - 1, -1, -1) if got[i] in known), None)
        if last is not None:
            cut = last + 1
            return offset, got, {field: (res[field][cut:] if res.get(field) is not None else None)
                                 for field in ("ids", *include)}
        if offset == 0:
            raise ChangedMeanwhile(
                "The collection changed too much while it was read (every record of the last pages read was deleted)",
                guidance="Retry: another process was deleting many records at once.")
        offset = max(0, offset - (PAGE - 1))


class ChangedMeanwhile(StoreUnavailableError):
    """A where-scan lost its place: every record of the two pages it last read was deleted before a `get` found
    one (2 x PAGE deletes at once behind the scan). Retryable: a caller that collects the whole scan (the
    registry's finds) scans again; one that streams (the keyword build) fails uncommitted and the next query
    builds again."""


def records(col: Any, include: Sequence[str], *, where: dict[str, Any] | None = None,
            ids: Sequence[str] | None = None) -> Iterator[tuple[Any, ...]]:
    """(id, *the fields named in `include`, in that order) for every record `pages` reads."""
    for res in pages(col, include, where=where, ids=ids):
        if res["ids"]:
            yield from zip(res["ids"], *(res[field] for field in include))


def is_visible(meta: dict[str, Any], current: dict[str, str]) -> bool:
    """The visibility rule; `current` maps each document to the content hash its manifest names."""
    return current.get(meta.get("source_document")) == meta.get("content_hash")


def visible_chunks(store: Any, collection: str, col: Any, *, embeddings: bool = False
                   ) -> Iterator[tuple[str, str, dict[str, Any], Any]]:
    """(id, text, metadata, embedding or None) of every visible chunk of `col`, in Chroma's order."""
    current = store.current_versions(collection)
    include = ["documents", "metadatas", *(["embeddings"] if embeddings else [])]
    for cid, text, meta, *vector in records(col, include):
        if is_visible(meta, current):
            yield cid, text, meta, (vector[0] if vector else None)


def all_ids(col: Any) -> set[str]:
    """The ids of every record of `col` (visible or not)."""
    return {rec[0] for rec in records(col, [])}


__all__ = ["PAGE", "ChangedMeanwhile", "all_ids", "is_visible", "pages", "records", "visible_chunks"]
