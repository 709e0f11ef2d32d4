"""Reading a Chroma collection page by page, and which chunks a reader may see.

The one paging loop: Chroma's `get` without a limit loads a whole collection at once (and SQLite refuses a
`get` by more ids than its variable limit), so every full read goes PAGE records at a time. It was written
four times (keyword index, node index, doctor, registry) before this module.

The visibility rule: a chunk is visible only if its document's manifest names its content hash. A write
puts a document's new chunks in before it flips the manifest and deletes the old ones after, so a reader
that applies this rule never sees half of a new version nor a stale one (docs/architecture.md,
"Consistency").
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

# Records per `get`: 5,000 chunks with documents and metadata are ~10-20 MB; one page of ids stays far below
# SQLite's 32,766 bound variables.
PAGE = 5000


def pages(col: Any, include: Sequence[str], *, where: dict[str, Any] | None = None,
          ids: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every record of `col` (only those matching `where`, or only `ids`), as Chroma `get` results of PAGE."""
    if ids is not None:
        for start in range(0, len(ids), PAGE):
            yield col.get(ids=list(ids[start:start + PAGE]), include=list(include))
        return
    offset = 0
    while True:
        res = col.get(where=where, include=list(include), limit=PAGE, offset=offset)
        yield res
        if len(res["ids"]) < PAGE:
            return
        offset += PAGE


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


__all__ = ["PAGE", "all_ids", "is_visible", "pages", "records", "visible_chunks"]
