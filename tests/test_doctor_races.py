"""`doctor --repair` beside other processes on a Chroma server never deletes live data (round 2 attack findings).

A real `chroma run` server; other processes are real `kb` subprocesses, run at a chosen moment of doctor's
scan (a wrapped `chunks._scan`, as tests/test_paging.py interleaves), or records they would leave (a reindex
lease and working copy, a young intent of another machine).
"""

from __future__ import annotations

import json
import time

from research_agent.storage import chunks
from test_concurrency import cli_argv
from test_server_writes import _open, _seed, _server_env, _unique, assert_chunks_of_manifests


def _after_first_chunk_page(monkeypatch, collection: str, action) -> list[int]:
    """Run `action` once, right after the first page of the full chunk scan of `collection`."""
    monkeypatch.setattr(chunks, "PAGE", 20)
    original, fired = chunks._scan, []

    def scan(col, include, where):
        for page in original(col, include, where):
            yield page
            if where is None and not fired and getattr(col, "name", "") == collection:
                fired.append(1)
                action()
    monkeypatch.setattr(chunks, "_scan", scan)
    return fired


def test_repair_keeps_a_document_a_whole_write_changed_while_doctor_scanned(tmp_path, chroma_server, monkeypatch,
                                                                          fake_embedder):
    """Finding 2: a real `kb add-document` of a changed file runs between doctor's manifest read and the rest of
    its chunk scan. Old code took the new chunks for orphans and the document for incomplete, and deleted both."""
    import subprocess

    from research_agent.ops.doctor import run_doctor

    collection = _unique("race")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 30)
        doc = docs / "d5.txt"
        doc.write_text("document d5 second version zqxnewword alpha beta\n")
        argv = cli_argv(tmp_path, "--json", "kb", "add-document", str(doc), "--collection", collection, fake=True)

        def writer() -> None:
            proc = subprocess.run(argv, env=_server_env(chroma_server), cwd=tmp_path, capture_output=True,
                                  text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
        fired = _after_first_chunk_page(monkeypatch, collection, writer)
        report = run_doctor(c, repair=True)
        assert fired, "the writer never ran"
        manifests = {m["document"]: m for m in c.store.registry_find("document", collection).values()}
        assert len(manifests) == 30, report.actions
        assert_chunks_of_manifests(c, collection)
        assert report.healthy, report.model_dump()
    finally:
        c.close()


def test_repair_keeps_chunks_of_a_manifest_its_scan_missed(tmp_path, chroma_server, monkeypatch, fake_embedder):
    """Finding 1: a scan that missed a manifest (another process removed and re-added it meanwhile) made that
    document's chunks look orphaned; old code deleted them (and the next repair dropped the manifest)."""
    from research_agent.ops.doctor import run_doctor

    collection = _unique("missed")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 4)
        store, original, calls = c.store, c.store.registry_find, []

        def find(record, name=None):
            found = original(record, name)
            if record == "document" and name == collection and not calls:
                calls.append(1)
                found.pop(sorted(found)[0])  # as a scan that skipped a re-added record
            return found
        monkeypatch.setattr(store, "registry_find", find)
        report = run_doctor(c, repair=True)
        assert calls
        assert "removed 0 orphan chunks" in " ".join(report.actions), report.actions
        assert len(original("document", collection)) == 4
        assert_chunks_of_manifests(c, collection)
        assert report.healthy, report.model_dump()
    finally:
        c.close()


def test_repair_keeps_everything_when_another_process_removes_and_readds_during_its_manifest_scan(
        tmp_path, chroma_server, monkeypatch, fake_embedder):
    """Finding 1 as the attack ran it: real `kb remove-document` then `kb add-document` of one file, after the
    second page of doctor's manifest scan (PAGE=20, 50 documents). The re-added manifest goes last in Chroma's
    order; a scan that skips a record makes its chunks look orphaned. Whatever the scan does, repair must keep
    every document and its chunks."""
    import subprocess

    from research_agent.ops.doctor import run_doctor

    collection = _unique("readd")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 50)
        monkeypatch.setattr(chunks, "PAGE", 20)
        original, state = chunks._scan, {"pages": 0}

        def kb(*args: str) -> None:
            proc = subprocess.run(cli_argv(tmp_path, "--json", "kb", *args, "--collection", collection, fake=True),
                                  env=_server_env(chroma_server), cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]

        def scan(col, include, where):
            for page in original(col, include, where):
                yield page
                if "document" in json.dumps(where or {}) and collection in json.dumps(where or {}):
                    state["pages"] += 1
                    if state["pages"] == 2:
                        kb("remove-document", "docs/d3.txt")
                        kb("add-document", str(docs / "d3.txt"))
        monkeypatch.setattr(chunks, "_scan", scan)
        report = run_doctor(c, repair=True)
        monkeypatch.setattr(chunks, "_scan", original)
        assert state["pages"] >= 2
        assert len(c.store.registry_find("document", collection)) == 50, report.actions
        assert_chunks_of_manifests(c, collection)
        assert run_doctor(c).healthy
    finally:
        c.close()


def test_repair_keeps_an_incomplete_looking_document_an_intent_names(tmp_path, chroma_server, fake_embedder):
    """An incomplete document is dropped only when no intent names it: a write under way (another machine's,
    young) owns it; the repair reports it and leaves it for that writer or for recovery at 600 s."""
    from research_agent.ops.doctor import run_doctor
    from research_agent.storage.registry import INTENT, intent_key, version_ids

    collection = _unique("named")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 3)
        key, m = sorted(c.store.registry_find("document", collection).items())[0]
        c.store.get_collection(collection).delete(ids=version_ids(collection, [m]))
        c.store.registry_put({intent_key(collection): {
            "versions": [{k: m[k] for k in ("document", "content_hash", "chunk_count")}], "created": time.time(),
            "host": "other-machine", "pidns": None, "pid": 4343}}, INTENT, collection)
        report = run_doctor(c, repair=True)
        assert key in c.store.registry_find("document", collection), report.actions
        assert [ch.incomplete_documents for ch in report.collections if ch.collection == collection] == [
            [m["document"]]]
        assert not any("doctor --repair" in a for a in report.advice), report.advice  # only waiting helps
        intents = c.store.registry_find(INTENT, collection)
        c.store.registry_delete(list(intents))  # the writer is gone for good: now the repair drops it
        report = run_doctor(c, repair=True)
        assert key not in c.store.registry_find("document", collection), report.actions
        assert report.healthy, report.model_dump()
    finally:
        c.close()


def _foreign_lease(c, collection: str) -> None:
    from research_agent.storage import leases

    now = time.time()
    c.store.registry_put({leases.lease_key(collection): {"started": now - 30, "renewed": now, "host": "other-machine",
                                                        "pidns": None, "pid": 4242}}, leases.LEASE, collection)


def test_repair_leaves_a_live_reindexs_working_copy_and_reports_its_lease(tmp_path, chroma_server, fake_embedder):
    """Finding 3 and 4: a live reindex (its lease renewed, another machine) has a working copy; old code's repair
    deleted it (the reindex then died with NotFoundError) and called the store healthy while writes were refused."""
    from research_agent.storage.swaps import BACKUP_PREFIX, TMP_PREFIX, swap_name

    collection = _unique("rx")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 2)
        _foreign_lease(c, collection)
        # Its working copy (filling) and a backup (read while it settles); and a dead reindex's copy of another.
        copy, backup, dead = (swap_name(TMP_PREFIX, collection), swap_name(BACKUP_PREFIX, collection),
                              swap_name(TMP_PREFIX, "elsewhere"))
        for name in (copy, backup, dead):
            c.store.client.create_collection(name, embedding_function=None)
        from test_concurrency import run_cli

        env = _server_env(chroma_server)
        repaired = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
        report = json.loads(repaired.stdout)
        names = [col.name for col in c.store.client.list_collections()]
        assert copy in names and backup in names and dead not in names, names
        assert report["leftovers"] == []  # the live reindex's copies are not leftovers
        assert [(r["collection"], r["host"], r["pid"]) for r in report["reindexes"]] == [
            (collection, "other-machine", 4242)]
        assert report["healthy"] is False and repaired.returncode == 1
        assert any("being reindexed" in a and "4242" in a for a in report["advice"]), report["advice"]
        assert not any("doctor --repair" in a for a in report["advice"]), report["advice"]
    finally:
        c.close()


def test_advice_after_a_repair_that_left_foreign_writes_says_to_wait(tmp_path, chroma_server, fake_embedder):
    """Finding 4: a young intent of another machine cannot be undone; old code ended its repair with 'run
    doctor --repair' (the command just run). The advice names the writer and the 600 s after which it is undone."""
    from research_agent.storage import writer
    from research_agent.storage.registry import INTENT, intent_key
    from test_concurrency import run_cli

    collection = _unique("foreign")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 2)
        m = next(iter(c.store.registry_find("document", collection).values()))
        c.store.registry_put({intent_key(collection): {
            "versions": [{k: m[k] for k in ("document", "content_hash", "chunk_count")}], "created": time.time(),
            "host": "other-machine", "pidns": None, "pid": 4343}}, INTENT, collection)
        repaired = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=_server_env(chroma_server))
        report = json.loads(repaired.stdout)
        assert report["healthy"] is False and repaired.returncode == 1
        assert not any("doctor --repair" in a for a in report["advice"]), report["advice"]
        assert any("4343" in a and "other-machine" in a and f"{int(writer.STALE_INTENT_SECONDS)} s" in a
                   for a in report["advice"]), report["advice"]
        assert_chunks_of_manifests(c, collection)
    finally:
        c.close()


def test_repair_keeps_the_records_of_a_collection_a_reindex_took_its_lease_on_after_doctor_started(
        tmp_path, chroma_server, fake_embedder, monkeypatch):
    """The last attack pass: a reindex took its lease after doctor had read the leases, and doctor's stray check
    ran between the reindex's two renames (the collection then exists only under its backup name): doctor
    removed every document record of the collection as "records of deleted collections", and the reindex's
    catch-up dropped their chunks. The stray check now reads the leases and the swap names again right before
    deleting."""
    import socket

    from research_agent.ops import doctor
    from research_agent.storage import leases, swaps

    c, collection = _open(chroma_server), _unique("gap")
    _seed(c, tmp_path, collection, 6)
    live = c.store.get_collection(collection)
    c.store.rename_collection(live, swaps.swap_name(swaps.BACKUP_PREFIX, collection))  # the reindex's 1st rename
    now = time.time()
    c.store.registry_put({leases.lease_key(collection): {"started": now, "renewed": now, "pidns": None, "pid": 4242,
                                                         "host": f"not-{socket.gethostname()}", "token": "t"}},
                         leases.LEASE, collection)
    monkeypatch.setattr(doctor, "_live_reindexes", lambda c: [])  # doctor read the leases before it was taken
    doctor.run_doctor(c, repair=True)
    assert len(c.store.registry_find("document", collection)) == 6  # the old code removed all six
