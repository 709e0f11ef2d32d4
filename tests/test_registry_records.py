"""Malformed intents and registry records (task H1c): they crash nothing, and a malformed intent never deletes a
live document's chunks.

Findings: `intent_stale` did `float(record.get("created"))`, so an intent with `created` null, "x" or a list
crashed recovery (every write of its collection), doctor and the reindex drain; one with pid 2**70 or NaN counted
as a live writer's; recovery took an intent's `chunk_count` "1" for 1 and deleted the live chunk its garbled hash
named; `registry_get` / `registry_find` raised on any record whose document is not JSON, so one garbled record
(anyone who can write to a Chroma server can make one) made every command reading its kind fail.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from test_concurrency import cli_env, open_store, run_cli
from test_server_writes import _open, _seed, _unique

NOW = 1_800_000_000.0
ENTRY = {"document": "docs/d0.txt", "content_hash": "a" * 64, "chunk_count": 2}
GOOD = {"versions": [ENTRY], "created": NOW, "host": "another-machine", "pidns": None, "pid": 4242}

#: Intents whose versions recovery can use but whose writer or date is garbled: stale (a dead writer's), never live.
BAD_WRITER = {
    "created null": {**GOOD, "created": None},
    "created text": {**GOOD, "created": "x"},
    "created numeric text": {**GOOD, "created": str(NOW)},
    "created list": {**GOOD, "created": [NOW]},
    "created true": {**GOOD, "created": True},
    "created NaN": '{"versions": [], "created": NaN, "host": "h", "pid": 1}',
    "created Infinity": '{"versions": [], "created": Infinity}',
    "created 1e308": {**GOOD, "created": 1e308},
    "pid 2**70": {**GOOD, "pid": 2**70},
    "pid true": {**GOOD, "pid": True},
    "pid text": {**GOOD, "pid": "4242"},
    "host int": {**GOOD, "host": 5},
    "host huge": {**GOOD, "host": "h" * 10_000},
    "pidns int": {**GOOD, "pidns": 3},
}

#: Intents recovery cannot act on: never undone (that deletes the chunks they name), only removed.
UNACTIONABLE = {
    "not JSON": "{not json",
    "a list": [ENTRY],
    "null": None,
    "versions missing": {k: v for k, v in GOOD.items() if k != "versions"},
    "versions text": {**GOOD, "versions": "docs/d0.txt"},
    "entry not an object": {**GOOD, "versions": ["docs/d0.txt"]},
    "document missing": {**GOOD, "versions": [{"content_hash": "a" * 64, "chunk_count": 1}]},
    "document int": {**GOOD, "versions": [{**ENTRY, "document": 5}]},
    "hash empty": {**GOOD, "versions": [{**ENTRY, "content_hash": ""}]},
    "chunk count text": {**GOOD, "versions": [{**ENTRY, "chunk_count": "1"}]},
    "chunk count true": {**GOOD, "versions": [{**ENTRY, "chunk_count": True}]},
    "chunk count 2**70": {**GOOD, "versions": [{**ENTRY, "chunk_count": 2**70}]},
    "chunk count negative": {**GOOD, "versions": [{**ENTRY, "chunk_count": -1}]},
}


def _text(raw) -> str:
    return raw if isinstance(raw, str) else json.dumps(raw)


# -- pure logic --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(BAD_WRITER))
def test_an_intent_with_a_garbled_writer_or_date_is_stale_and_never_raises(name):
    """Old code: TypeError / ValueError out of `intent_stale` (created null, text, list), or a live writer's
    intent for 600 s or forever (created NaN, pid 2**70: recovery never undid it, the drain waited for it)."""
    from research_agent.storage.leases import intent_stale

    raw = BAD_WRITER[name]
    decoded = json.loads(raw) if isinstance(raw, str) else raw
    for record in (decoded, json.loads(json.dumps(decoded, allow_nan=True))):
        assert intent_stale(record, 600, NOW) is True
        assert intent_stale(record, 600, NOW + 10_000) is True


@pytest.mark.parametrize("name", list(BAD_WRITER))
def test_parse_intent_keeps_usable_versions_and_drops_garbled_writer_fields(name):
    from research_agent.storage.registry import parse_intent

    parsed = parse_intent(_text(BAD_WRITER[name]))
    assert parsed is not None and parsed["malformed"], parsed
    assert all(f not in parsed for f in parsed["malformed"])  # what readers may not trust is gone
    assert parse_intent(parsed) == parsed  # parsing again changes nothing, and stays untrusted


@pytest.mark.parametrize("name", list(UNACTIONABLE))
def test_an_intent_recovery_cannot_act_on_parses_as_none_and_is_stale(name):
    from research_agent.storage.leases import intent_stale
    from research_agent.storage.registry import decode_record, parse_intent

    raw = UNACTIONABLE[name]
    assert parse_intent(_text(raw)) is None and decode_record("intent:kb:x", _text(raw)) is None
    assert intent_stale(raw, 600, NOW) is True


def test_a_well_formed_intent_is_read_as_it_is_and_live_while_young():
    from research_agent.storage.leases import intent_stale
    from research_agent.storage.registry import parse_intent

    assert parse_intent(json.dumps(GOOD)) == GOOD
    older = {"versions": [ENTRY]}  # an older version's intent (no date, no writer): a dead writer's, as always
    assert parse_intent(older) == older and intent_stale(older, 600, NOW)
    assert not intent_stale(GOOD, 600, NOW + 10) and intent_stale(GOOD, 600, NOW + 601)


# -- a real embedded store and the real model ---------------------------------------------------------------------
def _put_raw(c, key: str, kind: str, doc, collection: str | None = None, **meta) -> None:
    """A registry record stored as given (any text, not only what registry_put would write)."""
    c.store.meta.upsert(ids=[key], embeddings=[[1.0]], documents=[_text(doc)],
                        metadatas=[{"record": kind, **({"collection": collection} if collection else {}), **meta}])


def _two_documents(c, tmp_path) -> Path:
    """Collection "kbase" holding docs/d0.txt and docs/d1.txt (packaged model); returns the docs folder."""
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest.service import ingest_path

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(2):
        (docs / f"d{i}.txt").write_text(f"document d{i} first version wordd{i}x alpha beta\n")
    create_collection(c, "kbase")
    ingest_path(c, docs, "kbase", recursive=True)
    return docs


def test_garbled_records_are_skipped_and_malformed_intents_never_delete_live_chunks(tmp_path, caplog):
    """On an embedded store with the packaged model. Old code: the write, doctor, `projects list` and a query's
    reads raised JSONDecodeError / TypeError; and recovery (every write first) deleted d0's live chunk named by
    an intent whose chunk count was the text "1" and whose hash shares its first 12 characters."""
    from research_agent.catalog.projects import list_projects
    from research_agent.ingest.service import ingest_path
    from research_agent.ops.doctor import run_doctor
    from research_agent.storage.registry import chunk_ids, version_ids

    store = tmp_path / "store"
    c = open_store(store)
    try:
        docs = _two_documents(c, tmp_path)
        manifests = c.store.registry_find("document", "kbase")
        [m0] = [m for m in manifests.values() if m["document"].endswith("d0.txt")]
        live = set(version_ids("kbase", manifests.values()))
        col = c.store.get_collection("kbase")
        # A dead writer's leftover: a chunk of a version of d0 no manifest names (its intent's date is garbled).
        old_hash = "0" * 64
        [orphan] = chunk_ids("kbase", m0["document"], old_hash, 1)
        vector = col.get(ids=[sorted(live)[0]], include=["embeddings"])["embeddings"][0]
        col.upsert(ids=[orphan], embeddings=[list(vector)], documents=["old text"],
                   metadatas=[{"source_document": m0["document"], "content_hash": old_hash}])
        current = {"document": m0["document"], "content_hash": m0["content_hash"], "chunk_count": m0["chunk_count"]}
        _put_raw(c, "intent:kbase:" + "1" * 32, "intent", {
            "versions": [{"document": m0["document"], "content_hash": old_hash, "chunk_count": 1}, current],
            "created": "x", "pid": 2**70, "host": "h"}, "kbase")
        _put_raw(c, "intent:kbase:" + "2" * 32, "intent", {"versions": [{
            "document": m0["document"], "content_hash": m0["content_hash"][:12] + "zz", "chunk_count": "1"}],
            "created": 0}, "kbase")
        _put_raw(c, "intent:kbase:" + "3" * 32, "intent", "{not json", "kbase")
        _put_raw(c, "project:garbled", "project", "[1, 2]")
        _put_raw(c, "history:00000000000000000001-garble", "history", "{nope")
        _put_raw(c, "document:kbase:docs/zz.txt", "document", "not json", "kbase")
        _put_raw(c, "change:kbase:00000000000000000001-garbled", "change", {"revision": "r", "at": "x"}, "kbase",
                 at=time.time_ns())

        caplog.set_level(logging.WARNING)
        assert "project:garbled" not in c.store.registry_find("project")
        assert c.store.registry_get(["project:garbled", "document:kbase:docs/zz.txt"]) == {}
        assert list_projects(c).projects == [] or all(p.name != "garbled" for p in list_projects(c).projects)
        assert len(c.store.registry_find("document", "kbase")) == 2
        named = [r.getMessage() for r in caplog.records if "project:garbled" in r.getMessage()]
        assert len(named) == 1, named  # one warning per record, not one per read
        assert set(c.store.registry_find("intent", "kbase")) == {"intent:kbase:" + "1" * 32}

        report = run_doctor(c)  # old code: JSONDecodeError
        assert [ch.unfinished_writes for ch in report.collections if ch.collection == "kbase"] == [1]
        [garbled] = [a for a in report.advice if "no read can use" in a]  # named, never deleted by doctor
        assert "'document:kbase:docs/zz.txt'" in garbled and not report.healthy
        assert run_doctor(c, repair=True).advice and c.store.meta.get(ids=["project:garbled"])["ids"]

        (docs / "d1.txt").write_text("document d1 second version wordd1x alpha beta\n")
        assert ingest_path(c, docs / "d1.txt", "kbase").updated == 1  # its recovery: old code raised or deleted
        assert not c.store.meta.get(where={"record": "intent"})["ids"], "recovery left a malformed intent"
        present = set(col.get(include=[])["ids"])
        assert set(version_ids("kbase", [m0])) <= present, "a malformed intent deleted d0's live chunks"
        assert orphan not in present, "the dead writer's leftover (intent with a garbled date) was not undone"
        assert any("malformed write intents" in r.getMessage() and "2" * 32 in r.getMessage()
                   for r in caplog.records)
        assert c.store.registry_malformed() == sorted([
            "change:kbase:00000000000000000001-garbled", "document:kbase:docs/zz.txt",
            "history:00000000000000000001-garble", "project:garbled"])
        assert c.store.registry_malformed("project") == ["project:garbled"]  # listed, never deleted by a read
    finally:
        c.close()

    # The CLI as a user runs it (its own process): every command still works and prints no traceback.
    env = cli_env(store, fake=False)
    for args in (("--json", "projects", "list"), ("--json", "query", "alpha", "--collections", "kbase"),
                 ("--json", "doctor")):
        done = run_cli(tmp_path, *args, fake=False, env=env)
        # doctor exits 1 (not healthy): it names the records no read can use, and leaves them
        assert done.returncode == (1 if "doctor" in args else 0), (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        out = json.loads(done.stdout)
        if "doctor" in args:
            assert any("'project:garbled'" in a for a in out["advice"]), out["advice"]


def test_recovery_never_deletes_live_chunks_on_a_garbled_intents_word(tmp_path):
    """Old code: recovery (the first step of every write) took the chunk count "1" for 1 and deleted d0's live
    first chunk, named by a hash sharing its first 12 characters; now the intent is removed, never undone."""
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest.service import ingest_path, recover_interrupted
    from research_agent.storage.registry import version_ids

    c = open_store(tmp_path / "store")
    try:
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "d0.txt").write_text("document d0 first version alpha beta\n")
        create_collection(c, "kbase")
        ingest_path(c, docs, "kbase", recursive=True)
        [m0] = c.store.registry_find("document", "kbase").values()
        _put_raw(c, "intent:kbase:" + "2" * 32, "intent", {"versions": [{
            "document": m0["document"], "content_hash": m0["content_hash"][:12] + "zz", "chunk_count": "1"}],
            "created": 0}, "kbase")
        col = c.store.get_collection("kbase")
        with c.store.write_lock():
            assert recover_interrupted(c, "kbase", col) == 0
        assert set(version_ids("kbase", [m0])) <= set(col.get(include=[])["ids"]), "a live chunk was deleted"
        assert not c.store.meta.get(where={"record": "intent"})["ids"]
    finally:
        c.close()


# -- a real Chroma server -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_malformed_intents_on_a_server_crash_no_write_doctor_or_reindex_drain(tmp_path, chroma_server,
                                                                              fake_embedder):
    """Server mode (recovery undoes only intents it knows dead). Old code: the write, doctor and the reindex's
    drain raised TypeError on `created` null; an intent with pid 2**70 dated now was a live writer's, so the
    drain waited its full 60 s and recovery left it for 600 s."""
    from research_agent.ingest.service import ingest_path
    from research_agent.ops.doctor import run_doctor
    from research_agent.storage.leases import ReindexLease

    collection = _unique("badintent")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 2)
        m0 = next(m for m in c.store.registry_find("document", collection).values() if m["document"].endswith("d0.txt"))
        entry = {"document": m0["document"], "content_hash": m0["content_hash"], "chunk_count": m0["chunk_count"]}
        _put_raw(c, f"intent:{collection}:{'a' * 32}", "intent", {"versions": [entry], "created": None}, collection)
        _put_raw(c, f"intent:{collection}:{'b' * 32}", "intent",
                 {"versions": [entry], "created": time.time(), "host": "another-machine", "pid": 2**70}, collection)
        _put_raw(c, f"intent:{collection}:{'c' * 32}", "intent", "[not an intent", collection)
        misfiled = f"document:{collection}:docs/zz.txt"  # a record under another key whose metadata says intent
        _put_raw(c, misfiled, "intent", {"document": "docs/zz.txt"}, collection)

        assert run_doctor(c).collections  # old code: TypeError / JSONDecodeError
        start = time.monotonic()
        with ReindexLease(c.store, collection, stale_intent_seconds=600) as lease:
            assert lease.drain() is True
        assert time.monotonic() - start < 20, "the drain waited for a malformed intent"

        (docs / "d1.txt").write_text("document d1 second version\n")
        assert ingest_path(c, docs / "d1.txt", collection).updated == 1
        assert not c.store.registry_find("intent", collection)
        assert c.store.meta.get(where={"record": "intent"})["ids"] == [misfiled], "recovery removed a non-intent key"
        present = set(c.store.get_collection(collection).get(include=[])["ids"])
        from research_agent.storage.registry import version_ids

        assert set(version_ids(collection, c.store.registry_find("document", collection).values())) == present
    finally:
        c.close()


#: Manifests no read can use: before, one of them made listing, queries, doctor and every ingest of the collection
#: fail "Unexpected failure" (KeyError, ValidationError, TypeError), and a chunk count of 2**40 made a reader build
#: a trillion chunk ids. Every field has been written by every version since the first.
MANIFEST = {"document": "docs/d1.txt", "title": "d1", "kind": "document", "source": "docs/d1.txt",
            "path": "/x/docs/d1.txt", "content_hash": "b" * 64, "chunk_count": 1,
            "updated_at": "2026-11-25T00:00:00+00:00", "collection": "kbase", "added_at": "2026-11-25T00:00:00+00:00",
            "extra": None}
BAD_MANIFESTS = {
    "hash missing": {k: v for k, v in MANIFEST.items() if k != "content_hash"},
    "hash empty": {**MANIFEST, "content_hash": ""},
    "document missing": {k: v for k, v in MANIFEST.items() if k != "document"},
    "document int": {**MANIFEST, "document": 7},
    "chunk count text": {**MANIFEST, "chunk_count": "1"},
    "chunk count 2**40": {**MANIFEST, "chunk_count": 2**40},
    "chunk count negative": {**MANIFEST, "chunk_count": -3},
    "title missing": {k: v for k, v in MANIFEST.items() if k != "title"},
    "kind null": {**MANIFEST, "kind": None},
    "source list": {**MANIFEST, "source": ["a"]},
    "updated_at missing": {k: v for k, v in MANIFEST.items() if k != "updated_at"},
    "path int": {**MANIFEST, "path": 5},
}


@pytest.mark.parametrize("name", BAD_MANIFESTS)
def test_a_malformed_manifest_is_skipped_named_by_doctor_and_replaced_by_the_next_ingest(tmp_path, name):
    """A garbled manifest (anyone who can write to a Chroma server can make one) costs only its own document: the
    other documents list and answer, doctor names the record and is not healthy, and ingesting the file again
    writes a good manifest over it."""
    from research_agent.errors import DocumentError
    from research_agent.ingest.documents import list_documents
    from research_agent.ingest.service import ingest_path, reindex_collection
    from research_agent.ops.doctor import run_doctor
    from research_agent.search.service import query_knowledge

    c = open_store(tmp_path / "store")
    try:
        docs = _two_documents(c, tmp_path)
        [key] = [k for k, m in c.store.registry_find("document", "kbase").items() if m["document"].endswith("d1.txt")]
        _put_raw(c, key, "document", BAD_MANIFESTS[name], "kbase")

        assert [d.document for d in list_documents(c, "kbase").documents] == ["docs/d0.txt"]
        hits = query_knowledge(c, "wordd0x", collections=["kbase"], mode="keyword", rerank=False).results
        assert hits and hits[0].source_document == "docs/d0.txt"
        report = run_doctor(c)
        assert not report.healthy and any(key in a for a in report.advice), report.advice
        # Its chunks are no orphans to delete, nor left behind by a reindex: the record may be restored by hand
        # (a note has no file to re-ingest). Review of 2026-11-25: repair deleted them, a reindex dropped them.
        col = c.store.get_collection("kbase")
        chunks_before = set(col.get(include=[])["ids"])
        run_doctor(c, repair=True)
        assert set(c.store.get_collection("kbase").get(include=[])["ids"]) == chunks_before
        with pytest.raises(DocumentError) as refused:
            reindex_collection(c, "kbase")
        assert key in refused.value.message and "doctor" in refused.value.data["guidance"]
        assert set(c.store.get_collection("kbase").get(include=[])["ids"]) == chunks_before
        assert ingest_path(c, docs, "kbase", recursive=True).files_seen == 2
        manifests = c.store.registry_find("document", "kbase")
        assert sorted(m["document"] for m in manifests.values()) == ["docs/d0.txt", "docs/d1.txt"]
        assert c.store.registry_malformed() == []
    finally:
        c.close()


PROJECT = {"name": "proj1", "description": "", "collections": ["kbase"], "default_collections": [],
           "created_at": "2026-11-25T00:00:00+00:00"}
BAD_PROJECTS = {
    "fields missing": {"name": "proj1"},
    "collections text": {**PROJECT, "collections": "kbase"},
    "defaults int": {**PROJECT, "default_collections": 5},
    "collection names not text": {**PROJECT, "collections": [1, None]},
    "name int": {**PROJECT, "name": 7},
    "description null": {**PROJECT, "description": None},
}


@pytest.mark.parametrize("name", BAD_PROJECTS)
def test_a_malformed_project_is_skipped_named_by_doctor_and_can_be_created_again(tmp_path, name):
    """`projects list` failed "Unexpected failure" (ValidationError) on one garbled project record; now the others
    list, doctor names it, and creating the project again writes a good record over it."""
    from research_agent.catalog.collections import create_collection
    from research_agent.catalog.projects import create_project, get_project_info, list_projects
    from research_agent.errors import ResearchAgentError
    from research_agent.ops.doctor import run_doctor

    c = open_store(tmp_path / "store")
    try:
        create_collection(c, "kbase")
        create_project(c, "proj0")
        _put_raw(c, "project:proj1", "project", BAD_PROJECTS[name])
        assert [p.name for p in list_projects(c).projects] == ["proj0"]
        with pytest.raises(ResearchAgentError):
            get_project_info(c, "proj1")
        report = run_doctor(c)
        assert not report.healthy and any("'project:proj1'" in a for a in report.advice), report.advice
        create_project(c, "proj1")
        assert [p.name for p in list_projects(c).projects] == ["proj0", "proj1"]
        assert c.store.registry_malformed() == []
    finally:
        c.close()
