"""The catch-up's skew window after a bulk load (issue 16): change records the index has already applied are
not read again, while a record that lands late or whose write was still in flight is.

A catch-up re-reads the change records of the last SKEW_SECONDS (300 s on a Chroma server) before its position.
Right after a bulk load (a CI ingest) those records name thousands of documents, and each catch-up of the next
five minutes read all their manifests: 6,026 for a one-document catch-up at 10k chunks (0.63 s; 2.2-2.4 s for
the next query after two writes, benchmarks/SCALE.md). The manifests a catch-up reads are counted here by
watching the store's registry reads during `catch_up` (no timing)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from research_agent.catalog import collections, notes as augment
from research_agent.catalog.collections import open_collection
from research_agent.search import keyword_sync as sync, service as query
from research_agent.storage import registry

BULK_WRITES, BULK_DOCS = 3, 40  # three writes of 40 documents: the bulk load in the window


def _write_docs(c, collection: str, numbers, body=lambda j: f"Animal fact number {j:04d}: okapis and narwhals differ."
                ) -> None:
    """One write of one-chunk documents (benchmarks/scale.py's bulk path), document j holding `body(j)`."""
    from research_agent.ingest import PreparedDocument, content_hash, write_documents
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import ParsedDocument

    docs = []
    for j in numbers:
        title, text = f"Note {j:04d}", body(j)
        chunks = chunk_document(ParsedDocument(text=text, format="text", title=title), source=f"doc{j:04d}",
                                max_tokens=c.settings.chunk_max_tokens)[:1]
        docs.append(PreparedDocument(document=f"doc{j:04d}", title=title, kind="document", source=f"doc{j:04d}",
                                     content_hash=content_hash(f"{title}\n{text}"), chunks=chunks))
    write_documents(c, collection, docs)


def _bulk_load(c, collection: str) -> None:
    collections.create_collection(c, collection)
    for w in range(BULK_WRITES):
        _write_docs(c, collection, range(w * BULK_DOCS, (w + 1) * BULK_DOCS))


def _manifests_read(monkeypatch) -> list[int]:
    """Per catch-up, the document manifests it read from the store (by key or by a whole-collection find)."""
    counts: list[int] = []
    real = sync.catch_up

    def counted(c, collection, col, index):
        store, n = c.store, [0]
        get, find = store.registry_get, store.registry_find

        def spy_get(ids):
            n[0] += sum(1 for i in ids if str(i).startswith(f"{registry.DOCUMENT}:"))
            return get(ids)

        def spy_find(record, collection=None):
            found = find(record, collection)
            n[0] += len(found) if record == registry.DOCUMENT else 0
            return found

        store.registry_get, store.registry_find = spy_get, spy_find
        try:
            return real(c, collection, col, index)
        finally:
            del store.registry_get, store.registry_find
            counts.append(n[0])

    monkeypatch.setattr(sync, "catch_up", counted)
    return counts


def _hits(c, collection: str, text: str) -> list[str]:
    with c.store.session():
        res = query.query_knowledge(c, text, collections=[collection], mode="keyword", rerank=False)
    return [h.content for h in res.results]


def _note(c, collection: str, name: str) -> str:
    """Add a one-chunk note whose text holds `name`; returns its document key."""
    return augment.add_research(c, collection, f"Tardigrades named {name} survive in space.", f"src-{name}",
                                title=f"Probe {name}").document


def _one_document_catch_ups_after_a_bulk_load(c, collection: str, monkeypatch) -> None:
    _bulk_load(c, collection)
    assert _hits(c, collection, "okapis narwhals")  # the first build
    read = _manifests_read(monkeypatch)
    for name in ("probeone", "probetwo"):  # each write's catch-up, both within the bulk load's window
        added = _note(c, collection, name)
        assert _hits(c, collection, name)[0].startswith(f"Tardigrades named {name}")
        last = sync.RECENT[-1]
        assert read[-1] == 1, f"a one-document catch-up read {read[-1]} manifests"
        assert (last.mode, last.documents, last.manifests) == ("log", [added], 1)


def test_after_a_bulk_load_a_one_document_catch_up_reads_one_manifest(container, fake_embedder, monkeypatch):
    """Trigger: every catch-up in the window re-read the manifests of every document the bulk load's records
    named (here 121 and 122; 6,026 at 10k chunks through a server). The embedded window is widened to the
    server's, as a server's writers need."""
    monkeypatch.setattr(sync, "EMBEDDED_SKEW_SECONDS", sync.SKEW_SECONDS)
    _one_document_catch_ups_after_a_bulk_load(container, "docs", monkeypatch)


def _server(chroma_server):
    from research_agent.container import build_container

    return build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])


def test_through_a_chroma_server_a_catch_up_after_a_bulk_load_reads_one_manifest(chroma_server, fake_embedder,
                                                                                 monkeypatch):
    c = _server(chroma_server)
    try:
        assert c.store.kind != "embedded"  # the server's skew window (SKEW_SECONDS) applies
        _one_document_catch_ups_after_a_bulk_load(c, "kw-window", monkeypatch)
    finally:
        c.close()


def test_a_record_stamped_before_the_position_but_written_after_the_catch_up_is_applied(chroma_server,
                                                                                        fake_embedder,
                                                                                        monkeypatch):
    """Clock skew between server writers: a writer whose clock is 60 s behind stamps its record before the
    index's position, after the catch-up that set that position ran. It is not among the records the index
    remembers, so it is read and its document applied."""
    c = _server(chroma_server)
    try:
        _bulk_load(c, "kw-late")
        assert _hits(c, "kw-late", "okapis")
        _note(c, "kw-late", "probeone")
        assert _hits(c, "kw-late", "probeone")  # the position: probeone's record
        position = sync.RECENT[-1]
        with monkeypatch.context() as lag:
            lag.setattr(registry, "time", SimpleNamespace(time_ns=lambda: time.time_ns() - 60_000_000_000))
            late = _note(c, "kw-late", "probelate")
        stamps = {tuple(r["documents"]): r["at"] for r in c.store.changes_since("kw-late", 0)}
        assert stamps[(late,)] < stamps[tuple(position.documents)]  # stamped before the position
        assert _hits(c, "kw-late", "probelate")[0].startswith("Tardigrades named probelate")
        assert (sync.RECENT[-1].mode, sync.RECENT[-1].documents) == ("log", [late])
    finally:
        c.close()


def test_a_write_whose_record_was_read_before_its_flip_is_applied_once_it_lands(chroma_server, fake_embedder,
                                                                                monkeypatch):
    """A catch-up may read a write's record before the write flips its manifests (a server has no read gate):
    that record was read but its document not yet changed, so it must not be remembered as applied. Here
    writer A is stopped right after logging; writer B's write completes and a reader catches up meanwhile."""
    a, b, reader = _server(chroma_server), _server(chroma_server), _server(chroma_server)
    try:
        _bulk_load(a, "kw-flight")
        assert _hits(reader, "kw-flight", "okapis")
        log_change, seen = a.store.log_change, {}

        def logged_then_others_run(collection, documents):
            rev = log_change(collection, documents)  # A's record is in the log; its manifests are not flipped
            seen["b"] = _note(b, "kw-flight", "probeb")
            seen["hits"] = _hits(reader, "kw-flight", "probeb probea")
            return rev

        a.store.log_change = logged_then_others_run
        added = _note(a, "kw-flight", "probea")
        del a.store.log_change
        assert seen["hits"] and seen["hits"][0].startswith("Tardigrades named probeb")
        assert not any("probea" in h for h in seen["hits"])  # A's document was not there yet
        assert _hits(reader, "kw-flight", "probea")[0].startswith("Tardigrades named probea")
        assert added in sync.RECENT[-1].documents
    finally:
        for c in (a, b, reader):
            c.close()


def test_the_remembered_records_are_bounded(container, fake_embedder, monkeypatch):
    """The index's state remembers at most MAX_APPLIED records (the newest); the others are read again."""
    monkeypatch.setattr(sync, "EMBEDDED_SKEW_SECONDS", sync.SKEW_SECONDS)
    monkeypatch.setattr(sync, "MAX_APPLIED", 2)
    collections.create_collection(container, "docs")
    count = 3  # records past the bound: their 10 documents each are read again
    for w in range(count + 2):
        _write_docs(container, "docs", range(w * 10, (w + 1) * 10))
    assert _hits(container, "docs", "okapis")
    with container.store.session():
        index = sync.keyword_index(container, "docs", open_collection(container, "docs"))
    assert len(index.state.applied) == 2
    read = _manifests_read(monkeypatch)
    _note(container, "docs", "probeone")
    assert _hits(container, "docs", "probeone")
    assert read[-1] == 1 + 10 * count  # the new one's document and those of the forgotten records


def test_writes_after_a_reset_cost_one_full_diff_not_one_each(container, fake_embedder, monkeypatch):
    """Trigger: a reset record (a bump no write names) inside the window made every catch-up of the window a
    full diff, not only the first (~7 s each at 1M documents on a server): the diff that read it now
    remembers it as applied."""
    monkeypatch.setattr(sync, "EMBEDDED_SKEW_SECONDS", sync.SKEW_SECONDS)
    _bulk_load(container, "docs")
    assert _hits(container, "docs", "okapis")
    container.store.bump_revision("docs")  # a reset record
    modes = []
    for name in ("probeone", "probetwo"):
        added = _note(container, "docs", name)
        assert _hits(container, "docs", name)[0].startswith(f"Tardigrades named {name}")
        modes.append((sync.RECENT[-1].mode, sync.RECENT[-1].documents))
    assert modes[0][0] == "diff" and modes[1] == ("log", [added])


def test_a_store_restored_from_a_backup_taken_mid_write_is_reconciled(container, fake_embedder, monkeypatch):
    """A backup of the store's files taken between a write's change record and its flip holds the record (not
    yet done) and the document's old version. The index applied that write before the restore; after it, the
    record is unfinished, so it is read again and the old version comes back. The restore is made by hand:
    the old manifest, chunks and revision put back, the record's done mark removed."""
    from research_agent.storage.registry import CHANGE, REVISION, document_key, revision_key, version_ids

    monkeypatch.setattr(sync, "EMBEDDED_SKEW_SECONDS", sync.SKEW_SECONDS)
    store = container.store
    _bulk_load(container, "docs")
    assert _hits(container, "docs", "okapis")
    col, key = open_collection(container, "docs"), document_key("docs", "doc0000")
    old_manifest, old_rev = store.registry_get([key])[key], store.revision("docs")
    old_chunks = col.get(ids=version_ids("docs", [old_manifest]), include=["embeddings", "documents", "metadatas"])
    _note(container, "docs", "unrelated")  # the write the restored store keeps, and the index's position
    zebra = _write_zebra(container)
    assert _hits(container, "docs", "zebras")  # applied, and its record remembered
    got = store.meta.get(where={"record": CHANGE}, include=["documents", "metadatas"])
    (rid, doc, meta), = [(i, d, m) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])
                         if json.loads(d)["documents"] == [zebra]]
    undone = {k: v for k, v in json.loads(doc).items() if k != "done"}
    store.meta.upsert(ids=[rid], embeddings=[[1.0]], documents=[json.dumps(undone)], metadatas=[meta])
    store.registry_put({key: old_manifest}, registry.DOCUMENT, "docs")
    col.upsert(ids=old_chunks["ids"], embeddings=old_chunks["embeddings"], documents=old_chunks["documents"],
               metadatas=old_chunks["metadatas"])
    store.registry_put({revision_key("docs"): {"revision": old_rev}}, REVISION, "docs")
    _note(container, "docs", "probeafter")  # the next write after the restore
    assert _hits(container, "docs", "probeafter")
    assert not _hits(container, "docs", "zebras")
    assert any("number 0000" in h for h in _hits(container, "docs", "number 0000"))


def _write_zebra(c) -> str:
    """doc0000's second version (a one-document write); returns its document key."""
    from research_agent.ingest import PreparedDocument, content_hash, write_documents
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import ParsedDocument

    title, body = "Note 0000", "Zebras graze on the savanna."
    chunks = chunk_document(ParsedDocument(text=body, format="text", title=title), source="doc0000",
                            max_tokens=c.settings.chunk_max_tokens)[:1]
    write_documents(c, "docs", [PreparedDocument(document="doc0000", title=title, kind="document", source="doc0000",
                                                 content_hash=content_hash(f"{title}\n{body}"), chunks=chunks)])
    return "doc0000"


def test_a_remembered_record_gone_from_the_log_makes_the_catch_up_a_full_diff(container, fake_embedder,
                                                                               monkeypatch):
    """A record the index remembers as applied is no longer in the log (the store was restored from a backup
    that lacks it): the log does not continue from the index, so every manifest is compared."""
    from research_agent.storage.registry import CHANGE

    monkeypatch.setattr(sync, "EMBEDDED_SKEW_SECONDS", sync.SKEW_SECONDS)
    _bulk_load(container, "docs")
    assert _hits(container, "docs", "okapis")
    with container.store.session():
        assert len(sync.keyword_index(container, "docs", open_collection(container, "docs")).state.applied) \
            == BULK_WRITES
    first = sorted(container.store.meta.get(where={"record": CHANGE})["ids"])[0]  # the load's first write
    container.store.meta.delete(ids=[first])
    _note(container, "docs", "probeone")
    assert _hits(container, "docs", "probeone")
    assert sync.RECENT[-1].mode == "diff"
