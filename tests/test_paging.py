"""Full scans through a Chroma server while another client deletes (finding 1 of the sixth attack pass).

`storage/chunks.pages` reads a where-scan PAGE records at a time. Chroma 1.5.9 returns a `get` in insertion
order (its internal row id: an upsert of an existing id keeps its place, a delete and re-add goes to the end),
so a delete of a record already read moves every later record one place down: an offset scan then skipped one
record per delete, records that existed for the whole scan. Through a server nothing stops another machine's
writer deleting meanwhile (a document's old chunk version, a removed document's manifest, pruned change
records). Here a deleter thread with its own client runs between the pages of the scan (deterministic
interleaving, real server); PAGE is made small so the scan has many pages.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from research_agent.storage import chunks, registry


class _Interleaved:
    """A Chroma collection whose where-scans let `step` (run in its own thread, joined) act after each page."""

    def __init__(self, col: Any, step: Callable[[], None]) -> None:
        self.col, self.step, self.pages = col, step, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.col, name)

    def get(self, **kwargs: Any) -> Any:
        res = self.col.get(**kwargs)
        if kwargs.get("ids") is None:
            self.pages += 1
            worker = threading.Thread(target=self.step)
            worker.start()
            worker.join(timeout=60)
        return res


def _http(server: dict[str, Any]) -> Any:
    import chromadb
    from chromadb.config import Settings

    return chromadb.HttpClient(host=server["host"], port=server["port"],
                               settings=Settings(anonymized_telemetry=False))


def _deleter(server: dict[str, Any], name: str, doomed: list[str], per_page: int) -> Callable[[], None]:
    """One step of another client: delete the next `per_page` of `doomed` (records the scan has passed)."""
    col = _http(server).get_collection(name)

    def step() -> None:
        batch, doomed[:] = doomed[:per_page], doomed[per_page:]
        if batch:
            col.delete(ids=batch)
    return step


def test_a_where_scan_skips_no_record_while_another_client_deletes_read_ones(chroma_server, monkeypatch):
    """600 records, every third doomed; after each page of 20 the other client deletes 10 doomed records the
    scan already read. The old scan lost 10 kept records per page (about 190 of the 400 kept)."""
    monkeypatch.setattr(chunks, "PAGE", 20)
    col = _http(chroma_server).create_collection("paging-del", embedding_function=None)
    ids = [f"r{i:04d}" for i in range(600)]
    col.add(ids=ids, embeddings=[[1.0]] * len(ids), documents=ids,
            metadatas=[{"kind": "doomed" if i % 3 == 0 else "kept"} for i in range(len(ids))])
    kept = {rid for i, rid in enumerate(ids) if i % 3}
    doomed = [rid for i, rid in enumerate(ids) if i % 3 == 0]
    scan = _Interleaved(col, _deleter(chroma_server, "paging-del", doomed, 10))
    seen = [rec[0] for rec in chunks.records(scan, ["documents"], where={"kind": {"$in": ["kept", "doomed"]}})]
    assert kept - set(seen) == set(), f"{len(kept - set(seen))} kept records skipped"
    assert len(seen) == len(set(seen)), "a record was read twice"
    assert scan.pages > 20 and not doomed  # the deleter ran between many pages


def test_a_scan_survives_deletes_behind_and_ahead_and_inserts(chroma_server, monkeypatch):
    """Deletes of records behind the scan (read) and ahead of it (not yet read), and new records appended:
    every record present for the whole scan is read exactly once, whatever the shift per page (1 to 30)."""
    monkeypatch.setattr(chunks, "PAGE", 25)
    col = _http(chroma_server).create_collection("paging-mix", embedding_function=None)
    ids = [f"m{i:04d}" for i in range(500)]
    col.add(ids=ids, embeddings=[[1.0]] * len(ids), documents=ids, metadatas=[{"kind": "x"}] * len(ids))
    doomed = [rid for i, rid in enumerate(ids) if i % 4 == 1]  # spread over the whole collection
    other = _http(chroma_server).get_collection("paging-mix")
    sizes, added = iter([1, 30, 2, 17, 0, 24, 5, 30] * 10), []

    def step() -> None:
        n = next(sizes)
        batch, doomed[:] = doomed[:n], doomed[n:]
        if batch:
            other.delete(ids=batch)
        new = f"new{len(added):04d}"
        other.add(ids=[new], embeddings=[[1.0]], documents=[new], metadatas=[{"kind": "x"}])
        added.append(new)

    deleted = set(doomed)
    scan = _Interleaved(col, step)
    seen = [rec[0] for rec in chunks.records(scan, [], where={"kind": "x"})]
    survivors = set(ids) - deleted
    assert survivors - set(seen) == set(), f"{len(survivors - set(seen))} records skipped"
    assert len(seen) == len(set(seen))
    assert set(seen) <= set(ids) | set(added)


def _put_manifests(c, n: int) -> list[str]:
    """n manifests of collection "kb" (documents d000.md, ...) in the registry; returns the document names."""
    docs = [f"d{i:03d}.md" for i in range(n)]
    c.store.registry_put({registry.document_key("kb", d): {"document": d, "content_hash": "h", "chunk_count": 1}
                          for d in docs}, registry.DOCUMENT, "kb")
    return docs


def test_registry_find_returns_every_manifest_while_another_client_removes_others(chroma_server, monkeypatch):
    """Manifests read by `registry_find` (visibility, diffs, reindex, doctor, export) while another machine
    removes documents: every manifest that was never removed is returned."""
    from research_agent.container import build_container

    c = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    try:
        monkeypatch.setattr(chunks, "PAGE", 10)
        docs = _put_manifests(c, 150)
        removed = [registry.document_key("kb", d) for i, d in enumerate(docs) if i % 5 == 0]
        c.store._meta = _Interleaved(c.store.meta, _deleter(chroma_server, registry.META_COLLECTION,
                                                            list(removed), 3))
        found = {m["document"] for m in c.store.registry_find(registry.DOCUMENT, "kb").values()}
        never_removed = {d for i, d in enumerate(docs) if i % 5}
        assert never_removed - found == set(), f"{len(never_removed - found)} manifests skipped"
    finally:
        c.store._meta = None
        c.close()


def test_changes_since_returns_every_record_while_older_ones_are_pruned(chroma_server, monkeypatch):
    """The change log read while another writer prunes expired records (the oldest, first in Chroma's order):
    every record that was never pruned is returned (the keyword index's catch-up reads its documents). Three
    deletes after every `get`, among the records just read, so most pages need a second `get` to find their
    place."""
    from research_agent.container import build_container

    c = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    try:
        revs = [c.store.log_change("kb", [f"d{i}.md"]) for i in range(80)]
        keys = c.store.meta.get(where={"record": registry.CHANGE}, include=[])["ids"]
        pruned = keys[:40]  # the oldest half, as `_append_change`'s prune deletes them
        monkeypatch.setattr(chunks, "PAGE", 8)
        c.store._meta = _Interleaved(c.store.meta, _deleter(chroma_server, registry.META_COLLECTION, pruned, 3))
        found = {r["revision"] for r in c.store.changes_since("kb", 0)}
        assert set(revs[40:]) - found == set(), f"{len(set(revs[40:]) - found)} change records skipped"
    finally:
        c.store._meta = None
        c.close()


def test_a_scan_whose_last_page_was_deleted_whole_raises_a_retryable_error(chroma_server, monkeypatch):
    """If every record of the page just read is deleted before the next one, nothing tells where the scan
    stopped: a coded, retryable error rather than a silent skip."""
    from research_agent.errors import StoreUnavailableError

    monkeypatch.setattr(chunks, "PAGE", 10)
    col = _http(chroma_server).create_collection("paging-gone", embedding_function=None)
    ids = [f"g{i:03d}" for i in range(60)]
    col.add(ids=ids, embeddings=[[1.0]] * len(ids), documents=ids, metadatas=[{"kind": "x"}] * len(ids))
    other = _http(chroma_server).get_collection("paging-gone")
    scan = _Interleaved(col, lambda: other.delete(ids=ids[:20]) if scan.pages == 2 else None)
    with pytest.raises(StoreUnavailableError, match="changed too much"):
        list(chunks.records(scan, [], where={"kind": "x"}))


def test_registry_find_scans_again_when_the_pages_it_read_were_deleted_whole(chroma_server, monkeypatch):
    """The two pages a find last read are deleted at once (a bulk removal): the scan cannot say where it was,
    so the find scans again (registry.SCAN_TRIES) and returns every manifest that was never removed."""
    from research_agent.container import build_container

    c = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    try:
        monkeypatch.setattr(chunks, "PAGE", 10)
        docs = _put_manifests(c, 100)
        other = _http(chroma_server).get_collection(registry.META_COLLECTION)
        gone = [registry.document_key("kb", d) for d in docs[:20]]
        meta = _Interleaved(c.store.meta, lambda: other.delete(ids=gone) if meta.pages == 2 else None)
        c.store._meta = meta
        found = {m["document"] for m in c.store.registry_find(registry.DOCUMENT, "kb").values()}
        assert set(docs[20:]) - found == set(), f"{len(set(docs[20:]) - found)} manifests skipped"
        assert meta.pages > 10 + 2  # a second scan ran
    finally:
        c.store._meta = None
        c.close()
