"""research_agent/storage (issue 13): the one paging loop, the visibility rule, and the registry key formats,
on a real embedded Chroma store."""

from __future__ import annotations

import time

from conftest import make_manifest
from research_agent.storage import chunks, registry

COLL = "paged"


def _collection(c, rows: list[tuple[str, str, str]]):
    """A collection holding one chunk per (id, source document, content hash)."""
    col = c.store.create_collection(COLL, {"embedding_model": "none"})
    col.add(ids=[r[0] for r in rows], embeddings=[[1.0, float(i)] for i in range(len(rows))],
            documents=[f"text of {r[0]}" for r in rows],
            metadatas=[{"source_document": r[1], "content_hash": r[2], "chunk_sequence_id": i}
                       for i, r in enumerate(rows)])
    return col


def test_the_paging_loop_reads_every_record_across_page_boundaries(container, monkeypatch):
    """Ten chunks and seven records read three at a time: nothing lost or repeated at a page edge (the loop
    ends on a short page, so 9 = 3 x 3 records would also end on an empty one)."""
    monkeypatch.setattr(chunks, "PAGE", 3)
    c = container
    with c.store.write_lock():
        col = _collection(c, [(f"id{i:02d}", "a.md", "h1") for i in range(10)])
        c.store.registry_put({registry.project_key(f"p{i}"): {"name": f"p{i}", "description": "", "collections": [],
                                                             "default_collections": [], "created_at": "2026-11-25"}
                              for i in range(7)}, registry.PROJECT)
    ids = [rec[0] for rec in chunks.records(col, ["documents"])]
    assert sorted(ids) == [f"id{i:02d}" for i in range(10)]
    assert chunks.all_ids(col) == set(ids)
    wanted = [f"id{i:02d}" for i in (0, 2, 3, 5, 7, 8, 9)]
    assert sorted(rec[0] for rec in chunks.records(col, ["metadatas"], ids=wanted)) == wanted
    assert len(c.store.registry_find(registry.PROJECT)) == 7
    keys = [registry.project_key(f"p{i}") for i in range(7)]
    assert set(c.store.registry_get(keys + keys[:2])) == set(keys)


def test_a_chunk_is_visible_only_if_its_manifest_names_its_content_hash(container):
    """The stale version of a.md and b.md (no manifest: a write killed before its manifest) stay hidden from
    every reader that pages the collection: the keyword index and the node index call the same rule."""
    from research_agent.discovery.node_index import _current_rows
    from research_agent.search.keyword_index import active_chunks

    c = container
    with c.store.write_lock():
        col = _collection(c, [("a-new-0", "a.md", "h1"), ("a-old-0", "a.md", "h0"), ("b-0", "b.md", "h2"),
                              ("a-new-1", "a.md", "h1"), ("c-0", "c.md", "h3")])
        c.store.registry_put({registry.document_key(COLL, d): make_manifest(d, h, collection=COLL)
                              for d, h in (("a.md", "h1"), ("c.md", "h3"))}, registry.DOCUMENT, COLL)
    visible = list(chunks.visible_chunks(c.store, COLL, col, embeddings=True))
    assert sorted(v[0] for v in visible) == ["a-new-0", "a-new-1", "c-0"]
    assert all(v[1] == f"text of {v[0]}" and len(v[3]) == 2 for v in visible)
    assert sorted(ch.id for ch in active_chunks(c, COLL, col)) == ["a-new-0", "a-new-1", "c-0"]
    rows = _current_rows(c, COLL, col)
    assert [(r[2], r[1]) for r in rows] == [("a.md", 0), ("a.md", 3), ("c.md", 4)]  # document, then chunk order


def test_registry_keys_keep_the_format_stores_were_written_with(container):
    """Keys are persisted: a store written before the keys moved here must still be found by them."""
    c = container
    assert registry.document_key("notes", "dir/a.md") == "document:notes:dir/a.md"
    assert registry.project_key("work") == "project:work"
    assert registry.revision_key("notes") == "revision:notes"
    first, second = registry.intent_key("notes"), registry.intent_key("notes")
    assert first.startswith("intent:notes:") and first != second
    older = registry.history_key()
    time.sleep(0.001)
    assert older.startswith("history:") and registry.history_key() > older
    with c.store.write_lock():
        c.store.create_collection("notes", {"embedding_model": "none"})
        # Written the way the store wrote revisions before issue 13:
        c.store.registry_put({"revision:notes": {"revision": "abc"}}, "revision", "notes")
    assert c.store.revision("notes") == "abc"
    with c.store.write_lock():
        rev = c.store.bump_revision("notes")
    assert c.store.registry_get(["revision:notes"])["revision:notes"]["revision"] == rev



def test_change_records_are_read_per_collection_and_expire_for_all(container, monkeypatch):
    """changes_since selects by record and time and keeps the collection's own records by key (a Chroma filter
    on `collection` scanned its manifests: 0.4 s per catch-up at 100k documents); expired records of every
    collection are pruned by any write."""
    store = container.store
    store.log_change("alpha", ["a.md"])
    store.log_change("alpha-2", ["b.md"])  # a name that starts like the other must not be mixed in
    store.log_change("beta", ["c.md"])
    assert [r["documents"] for r in store.changes_since("alpha", 0)] == [["a.md"]]
    assert [r["documents"] for r in store.changes_since("beta", 0)] == [["c.md"]]
    monkeypatch.setattr(registry, "CHANGE_LOG_SECONDS", 0)
    time.sleep(0.01)
    store.log_change("gamma", ["d.md"])
    assert store.changes_since("alpha", 0) == [] and store.changes_since("beta", 0) == []
    assert [r["documents"] for r in store.changes_since("gamma", 0)] == [["d.md"]]
