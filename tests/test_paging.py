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

from conftest import make_manifest
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
    c.store.registry_put({registry.document_key("kb", d): make_manifest(d) for d in docs}, registry.DOCUMENT, "kb")
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


def test_a_scan_past_its_budget_of_pages_read_again_raises_a_retryable_error(chroma_server, monkeypatch):
    """Going back to find its place is bounded: past MAX_REREADS pages read again per page moved on (here 0,
    so the first going back is one too many) the scan gives up with the coded, retryable ChangedMeanwhile
    rather than reading on while other processes keep deleting behind it. Three deletes just behind its next
    start leave that page one read record at its head, too few to trust: it would go back one page."""
    from research_agent.errors import StoreUnavailableError

    monkeypatch.setattr(chunks, "PAGE", 10)
    monkeypatch.setattr(chunks, "MAX_REREADS", 0)
    col = _http(chroma_server).create_collection("paging-churn", embedding_function=None)
    ids = [f"c{i:03d}" for i in range(60)]
    col.add(ids=ids, embeddings=[[1.0]] * len(ids), documents=ids, metadatas=[{"kind": "x"}] * len(ids))
    other = _http(chroma_server).get_collection("paging-churn")
    scan = _Interleaved(col, lambda: other.delete(ids=ids[9:12]) if scan.pages == 2 else None)
    with pytest.raises(StoreUnavailableError, match="changed too much"):
        list(chunks.records(scan, [], where={"kind": "x"}))
    monkeypatch.setattr(chunks, "MAX_REREADS", 3)  # the default budget: the same deletes cost one more get
    scan = _Interleaved(col, lambda: other.delete(ids=ids[13:16]) if scan.pages == 2 else None)
    seen = [rec[0] for rec in chunks.records(scan, [], where={"kind": "x"})]
    assert set(ids) - set(ids[9:16]) - set(seen) == set() and len(seen) == len(set(seen))
    assert scan.pages == 11  # 9 pages (60 - 7 records, 6 new a page) + the page at offset 0 + one going back


def test_registry_find_scans_again_when_the_pages_it_read_were_deleted_whole(chroma_server, monkeypatch):
    """The two pages a find last read are deleted at once (a bulk removal): the scan cannot say where it was,
    so the find scans again (chunks.SCAN_TRIES) and returns every manifest that was never removed."""
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


# -- a record already read, deleted and added again (remove-document then add, a re-ingest) goes LAST ----------

def _embedded(tmp_path) -> Any:
    import chromadb
    from chromadb.config import Settings

    return chromadb.PersistentClient(path=str(tmp_path / "chroma"), settings=Settings(anonymized_telemetry=False))


def _readd(col: Any, rids: list[str]) -> None:
    """Delete `rids` and add them again: Chroma puts them after every other record."""
    got = col.get(ids=rids, include=["embeddings", "documents", "metadatas"])
    col.delete(ids=rids)
    col.add(ids=got["ids"], embeddings=[list(e) for e in got["embeddings"]], documents=got["documents"],
            metadatas=got["metadatas"])


def _readd_scan(client: Any, name: str, n: int, plan: dict[int, list[str]], deletes: dict[int, list[str]]
                ) -> tuple[list[str], set[str]]:
    """Scan n records; after the page numbered k, re-add plan[k] and delete deletes[k] (another client's
    writes). Returns (ids yielded in order, ids present for the whole scan)."""
    col = client.create_collection(name, embedding_function=None)
    ids = [f"r{i:03d}" for i in range(n)]
    col.add(ids=ids, embeddings=[[float(i), 1.0] for i in range(n)], documents=ids,
            metadatas=[{"kind": "x"}] * n)
    other = client.get_collection(name)

    def step() -> None:
        if deletes.get(scan.pages):
            other.delete(ids=deletes[scan.pages])
        if plan.get(scan.pages):
            _readd(other, plan[scan.pages])
    scan = _Interleaved(col, step)
    seen = [rec[0] for rec in chunks.records(scan, [], where={"kind": "x"})]
    gone = {rid for batch in deletes.values() for rid in batch}
    moved = {rid for batch in plan.values() for rid in batch}
    return seen, set(ids) - gone - moved


# (records, {page: re-added after it}): PAGE is 20, so page 1 holds r000-r019.
READD_CASES = {
    "mid-scan": (100, {1: ["r010"]}),               # the tester's r010: the old scan missed r020-r029 of 30
    "last-window": (30, {1: ["r010"]}),             # the re-added record lands in the last, short page
    "last-of-a-page": (100, {1: ["r019"]}),         # the anchor itself moves last
    "anchors-of-a-page": (100, {1: ["r016", "r017", "r018", "r019"]}),  # every overlap anchor, in order
    "several-pages": (120, {1: ["r003"], 2: ["r025", "r030"], 4: ["r001", "r050"]}),
}


@pytest.mark.parametrize("case", sorted(READD_CASES))
def test_a_scan_yields_every_record_once_when_read_ones_are_re_added_embedded(tmp_path, monkeypatch, case):
    """Embedded Chroma: records the scan already read are deleted and added again between its pages (they go
    last). Every record present for the whole scan is yielded, and each record at most once."""
    monkeypatch.setattr(chunks, "PAGE", 20)
    n, plan = READD_CASES[case]
    seen, present = _readd_scan(_embedded(tmp_path), f"readd-{case}", n, plan, {})
    assert present - set(seen) == set(), f"skipped {sorted(present - set(seen))}"
    assert len(seen) == len(set(seen)), "a record was yielded twice"
    assert set(seen) == {f"r{i:03d}" for i in range(n)}  # re-added ones too: they were read before moving


@pytest.mark.parametrize("case", sorted(READD_CASES))
def test_a_scan_yields_every_record_once_when_read_ones_are_re_added_server(chroma_server, monkeypatch, case):
    """The same through `chroma run`: another machine's remove-document then add-document of a document the
    scan had read (finding 1 of the seventh attack pass)."""
    monkeypatch.setattr(chunks, "PAGE", 20)
    n, plan = READD_CASES[case]
    seen, present = _readd_scan(_http(chroma_server), f"readd-{case}", n, plan, {})
    assert present - set(seen) == set(), f"skipped {sorted(present - set(seen))}"
    assert len(seen) == len(set(seen)), "a record was yielded twice"


@pytest.mark.parametrize("where", ["embedded", "server"])
def test_a_scan_skips_nothing_under_bursts_of_deletes_and_re_adds(tmp_path, request, monkeypatch, where):
    """After every page another client re-adds three records the scan read and deletes five others it read
    (a re-ingest of some documents, a removal of others): every record never deleted is yielded exactly once,
    400 records in pages of 20."""
    monkeypatch.setattr(chunks, "PAGE", 20)
    client = _embedded(tmp_path) if where == "embedded" else _http(request.getfixturevalue("chroma_server"))
    plan = {k: [f"r{(k * 7 + j * 3) % (k * 16):03d}" for j in range(3)] for k in range(1, 20)}
    doomed = iter(f"r{i:03d}" for i in range(1, 400, 2) if all(f"r{i:03d}" not in b for b in plan.values()))
    deletes = {k: [rid for rid, _ in zip(doomed, range(5)) if int(rid[1:]) < k * 16] for k in range(1, 20)}
    seen, present = _readd_scan(client, "readd-burst", 400, plan, deletes)
    never_deleted = {f"r{i:03d}" for i in range(400)} - {rid for b in deletes.values() for rid in b}
    assert never_deleted - set(seen) == set(), f"skipped {sorted(never_deleted - set(seen))[:10]}"
    assert len(seen) == len(set(seen)), "a record was yielded twice"
    assert present <= set(seen)
