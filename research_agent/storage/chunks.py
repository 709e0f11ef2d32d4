"""Reading a Chroma collection page by page, and which chunks a reader may see.

The one paging loop: Chroma's `get` without a limit loads a whole collection at once (and SQLite refuses a
`get` by more ids than its variable limit), so every full read goes PAGE records at a time. It was written
four times (keyword index, node index, doctor, registry) before this module. A where-scan keeps its place by
the ids it read, not by offset alone, and remembers every id it yielded, so another process's deletes and
re-adds meanwhile make it skip nothing and yield nothing twice (`_scan`).

The visibility rule: a chunk is visible only if its document's manifest names its content hash. A write
puts a document's new chunks in before it flips the manifest and deletes the old ones after, so a reader
that applies this rule never sees half of a new version nor a stale one (docs/architecture.md,
"Consistency").
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Sequence, TypeVar

from research_agent.errors import StoreUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Records per `get`: 5,000 chunks with documents and metadata are ~10-20 MB; one page of ids stays far below
# SQLite's 32,766 bound variables.
PAGE = 5000
#: Records each where-scan page re-reads of the page before (1 in 50: 100 of 5,000, ~2% more records read) to
#: find where the last page ended: up to this many deletes behind the scan per page cost nothing more; more
#: cost one more `get` (`_place`).
OVERLAP_DIVISOR = 50
#: The overlap's floor (small pages in tests; at most half a page): one anchor alone is told apart from a
#: re-added record by nothing, four re-added in order at exactly the offset read is far less likely.
MIN_OVERLAP = 4
#: Pages a scan may read again (going back to find its place; nothing is yielded twice) per page it moves on,
#: before it gives up with ChangedMeanwhile: so a scan costs at most 4 x the `get`s of a plain one. It goes
#: back only when more records behind it left at once than half the overlap (50 at PAGE 5,000).
MAX_REREADS = 3


def pages(col: Any, include: Sequence[str], *, where: dict[str, Any] | None = None,
          ids: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every record of `col` (only those matching `where`, or only `ids`), as Chroma `get` results of PAGE."""
    if ids is not None:
        for start in range(0, len(ids), PAGE):
            yield col.get(ids=list(ids[start:start + PAGE]), include=list(include))
        return
    yield from _scan(col, list(include), where)


def _scan(col: Any, include: list[str], where: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """A where-scan by offset that skips no record present for the whole scan and yields each record once.

    Why not plain offsets: Chroma (1.5.9, embedded and `chroma run`) returns `get` results in insertion order
    (an upsert of an existing id keeps its place; a new record, or a deleted and re-added id, goes last), so a
    delete of a record already read moves every later one a place down and the next offset skipped one record
    per delete (finding 1). Inserts only append, so they never shift what is left. Each page therefore starts
    `overlap` records before where the last one ended (`_place` proves that start skips nothing or looks
    further back), and gives only records this scan has not yielded (`seen`, id -> read order): a record
    already read and re-added (remove then add of a document) sits at the end and is neither cut after (the old
    anchor rule skipped every record between: 10 of 30 in the tester's run) nor yielded twice."""
    overlap = min(max(MIN_OVERLAP, PAGE // OVERLAP_DIVISOR), max(1, PAGE // 2))  # tiny test pages still advance
    seen: dict[str, int] = {}
    offset, res, pages_read, extra = 0, col.get(where=where, include=include, limit=PAGE, offset=0), 1, 0
    while True:
        fresh = _unseen(res, include, seen)
        if fresh["ids"]:
            yield fresh
        got = res["ids"]
        if len(got) < PAGE:  # the last page: nothing came after it when it was read
            return
        offset, res, steps = _place(col, include, where, offset + PAGE - overlap, got[-overlap:], seen)
        pages_read, extra = pages_read + 1, extra + steps
        if extra > MAX_REREADS * pages_read:
            raise ChangedMeanwhile(
                f"The collection changed too much while it was read ({extra} pages read again for {pages_read} "
                "read: other processes deleted or re-added many records behind the scan)",
                guidance="Retry: another process was deleting or re-adding many records at once.")


def _unseen(res: dict[str, Any], include: list[str], seen: dict[str, int]) -> dict[str, Any]:
    """The records of `res` not in `seen` (a Chroma `get` result of them), which are then added to `seen`."""
    keep = [i for i, rid in enumerate(res["ids"]) if rid not in seen]
    for i in keep:
        seen[res["ids"][i]] = len(seen)
    return {field: ([res[field][i] for i in keep] if res.get(field) is not None else None)
            for field in ("ids", *include)}


def _place(col: Any, include: list[str], where: dict[str, Any] | None, offset: int, anchor: list[str],
           seen: dict[str, int]) -> tuple[int, dict[str, Any], int]:
    """(offset, page read there, pages read going back): the page at `offset` if its start skips nothing, else
    a page further back each time (windows overlap by one) until one does. Raises ChangedMeanwhile if even the
    first page does not (everything it read before is gone or moved: the caller scans again from scratch).

    A start skips nothing when the page begins with `anchor` (the last ids of the page before, in order: then
    no record before them left, the fast path of a scan nobody writes to meanwhile), or with a run of
    `_run_needed` ids this scan read, in the order it read them (deletes behind the scan keep that order). A
    re-added record goes last, so a start on one could skip what lies before it: that takes a run of re-adds in
    read order landing exactly at the offset read, with more deletes behind than the overlap at once."""
    res = col.get(where=where, include=include, limit=PAGE, offset=offset)
    if res["ids"][:len(anchor)] == anchor or _starts_with_run(res["ids"], seen, _run_needed(len(anchor))):
        return offset, res, 0
    steps = 0
    while offset > 0:
        offset, steps = max(0, offset - (PAGE - 1)), steps + 1
        res = col.get(where=where, include=include, limit=PAGE, offset=offset)
        if _starts_with_run(res["ids"], seen, _run_needed(len(anchor))):
            return offset, res, steps
    raise ChangedMeanwhile(
        "The collection changed too much while it was read (no page back to the first begins with records the "
        "scan read: other processes deleted or re-added them)",
        guidance="Retry: another process was deleting or re-adding many records at once.")


def _run_needed(overlap: int) -> int:
    """Read ids a page must begin with, in read order, to be trusted after deletes: half the overlap (50 of
    100 at PAGE 5,000), at least 2; up to overlap - that many deletes behind per page cost no extra `get`."""
    return max(2, overlap // 2)


def _starts_with_run(ids: list[str], seen: dict[str, int], need: int) -> bool:
    """Whether `ids` begins with `need` ids of `seen` in increasing read order (or is all such, if shorter)."""
    head = ids[:need]
    order = [seen.get(rid, -1) for rid in head]
    return bool(head) and order[0] >= 0 and all(a < b for a, b in zip(order, order[1:]))


#: Whole scans a reader makes before it gives up: a scan fails only when it cannot find its place (every record
#: it read gone or re-added back to its first page, or more than MAX_REREADS pages read again per page: other
#: processes deleting or re-adding many records behind it), so a second is nearly always enough.
SCAN_TRIES = 3


def rescanning(read: Callable[[], T]) -> T:
    """`read()` (a whole scan), run again, up to SCAN_TRIES times, while it raises ChangedMeanwhile."""
    for _ in range(SCAN_TRIES - 1):
        try:
            return read()
        except ChangedMeanwhile as exc:
            log.info("scanned again: %s", exc)
    return read()


class ChangedMeanwhile(StoreUnavailableError):
    """A where-scan lost its place: no page back to the first begins with records it read (all deleted or
    re-added meanwhile), or it read more than MAX_REREADS pages again per page it moved on. Retryable: a caller
    that collects the whole scan (the registry's finds) scans again; one that streams (the keyword build) fails
    uncommitted and the next query builds again."""


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


def all_ids(col: Any, ids: Sequence[str] | None = None) -> set[str]:
    """The ids of every record of `col` (visible or not), or of those of `ids` that exist."""
    return {rec[0] for rec in records(col, [], ids=ids)}


__all__ = ["PAGE", "SCAN_TRIES", "ChangedMeanwhile", "all_ids", "is_visible", "pages", "records", "rescanning",
           "visible_chunks"]
