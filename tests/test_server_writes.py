"""Server mode (`chroma run`): writes of several processes to one collection, where the write lock is per process.

Finding 2: `kb reindex` while another process writes the same collection lost the chunks of documents flipped
during the copy (the swap dropped them with the old collection). Finding 3: a writer killed between its chunk
deletion and its revision bump left the flip unannounced; `doctor` called the store healthy and other
processes' keyword indexes served the old text for up to 600 s.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_concurrency import FAKE_MODEL, TESTS_DIR, cli_argv, cli_env, open_store, run_cli

# A writer process: updates, adds and removes documents of one collection until told to stop; one JSON line
# per write on stdout. IGNORE_LEASE plays a writer that never sees the reindex lease (another version, or one
# that checked just before the lease was taken): the catch-up alone must keep its writes.
WRITER = '''
import json, os, random, sys, time
from pathlib import Path
sys.path.insert(0, TESTS_DIR)
from conftest import FakeEmbedder
from research_agent import embeddings
embeddings._cache[("sentence-transformers", "test-fake-embedder", "cpu")] = FakeEmbedder()
from research_agent.container import build_container
from research_agent.errors import StoreUnavailableError
from research_agent.ingest.service import ingest_path, remove_document
from research_agent.storage import writer
if os.environ.get("IGNORE_LEASE"):
    writer.check_no_reindex = lambda *a, **k: None
docs, coll, stop, first = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
c = build_container()
rnd = random.Random(7)
removable = list(range(first // 2, first))
for k in range(100000):
    if stop.exists():
        break
    act = rnd.random()
    try:
        if act < 0.25 and removable:
            i = removable.pop(rnd.randrange(len(removable)))
            remove_document(c, coll, f"docs/d{i}.txt")
            out = {"op": "rm", "doc": f"docs/d{i}.txt"}
        else:
            name = f"n{k}.txt" if act < 0.45 else f"d{rnd.randrange(first // 2)}.txt"
            (docs / name).write_text(f"document {name} version {k} wordv{k}x alpha beta\\n")
            ingest_path(c, docs / name, coll)
            out = {"op": "put", "doc": f"docs/{name}"}
    except StoreUnavailableError as exc:
        out = {"op": "refused", "message": exc.message}
        time.sleep(0.2)
    except Exception as exc:  # ignoring the lease, it may write into a collection the swap just dropped
        if not os.environ.get("IGNORE_LEASE"):
            raise
        out = {"op": "failed", "error": repr(exc)[:300]}
    print(json.dumps(out), flush=True)
    time.sleep(0.02)
'''.replace("TESTS_DIR", repr(TESTS_DIR))


def _server_env(chroma_server, **extra: str) -> dict[str, str]:
    return cli_env(None, fake=True, RESEARCH_AGENT_CHROMA_HOST=chroma_server["host"],
                   RESEARCH_AGENT_CHROMA_PORT=str(chroma_server["port"]), **extra)


def _open(chroma_server):
    return open_store(None, chroma_host=chroma_server["host"], chroma_port=chroma_server["port"],
                      embedding_model=FAKE_MODEL)


def _unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def _seed(c, tmp_path: Path, collection: str, n: int) -> Path:
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest.service import ingest_path

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(n):
        (docs / f"d{i}.txt").write_text(f"document d{i} first version wordd{i}x alpha beta\n")
    create_collection(c, collection)
    assert ingest_path(c, docs, collection, recursive=True).files_seen == n
    return docs


def assert_consistent(c, collection: str) -> None:
    """Every manifest's chunks exist in the live collection under its content hash, and nothing else does."""
    from research_agent.storage.registry import version_ids

    col = c.store.get_collection(collection)
    manifests = c.store.registry_find("document", collection)
    expected = set(version_ids(collection, manifests.values()))
    present = set(col.get(include=[])["ids"])
    assert not expected - present, f"{len(expected - present)} chunks of manifests missing from the live collection"
    assert present == expected, f"{len(present - expected)} chunks no manifest names"
    assert col.count() == sum(int(m["chunk_count"]) for m in manifests.values())


def _wait_for_writes(c, collection: str, writes: int) -> None:
    """Until `writes` more change records (one per write) are logged; 60 s at most."""
    start = len(c.store.registry_find("change", collection))
    deadline = time.monotonic() + 60
    while len(c.store.registry_find("change", collection)) < start + writes and time.monotonic() < deadline:
        time.sleep(0.1)


def _slow_embedding(monkeypatch, fake_embedder, seconds: float) -> None:
    """The reindex's encoder made slow enough (as a real model is) for the writer to write during the copy."""
    original = fake_embedder.embed_documents

    def slow(self, texts):
        time.sleep(seconds)
        return original(self, texts)

    monkeypatch.setattr(fake_embedder, "embed_documents", slow)


@pytest.mark.slow
@pytest.mark.parametrize("ignore_lease", [False, True], ids=["lease-honoured", "lease-ignored"])
def test_reindex_while_another_process_writes_loses_and_doubles_nothing(tmp_path, chroma_server, fake_embedder,
                                                                       monkeypatch, caplog, ignore_lease):
    from research_agent.ingest.service import reindex_collection

    caplog.set_level(logging.INFO, logger="research_agent.storage")
    collection, n = _unique("rx"), 120
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, n)
        (tmp_path / "writer.py").write_text(WRITER, encoding="utf-8")
        stop = tmp_path / "stop"
        env = _server_env(chroma_server, **({"IGNORE_LEASE": "1"} if ignore_lease else {}))
        writer = subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), str(docs), collection, str(stop),
                                   str(n)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            _wait_for_writes(c, collection, 3)  # the writer is writing before the reindex starts
            _slow_embedding(monkeypatch, fake_embedder, 0.04)  # ~120 documents: ~5 s of copying
            report = reindex_collection(c, collection)
            assert report.files_seen >= n // 2
            _wait_for_writes(c, collection, 3)  # and after it
        finally:
            stop.touch()
            out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-3000:]
        ops = [json.loads(line) for line in out.splitlines()]
        assert sum(o["op"] in ("put", "rm") for o in ops) >= 6, "the writer barely wrote"
        c.store.refresh()
        assert_consistent(c, collection)
        refused = [o for o in ops if o["op"] == "refused"]
        if not ignore_lease:
            assert refused and "being reindexed" in refused[0]["message"]
            assert not c.store.registry_find("intent", collection), "an intent was left behind"
        else:  # what it wrote during the copy was copied again by the catch-up
            assert not refused
            assert any("caught up with" in r.getMessage() for r in caplog.records)
        removed = {o["doc"] for o in ops if o["op"] == "rm"}
        names = {m["document"] for m in c.store.registry_find("document", collection).values()}
        assert removed and not removed & names, "a removed document came back"
        assert not c.store.registry_find("lease", collection), "the reindex lease was left behind"
    finally:
        c.close()


def _keyword_docs(c, collection: str, word: str) -> list[str]:
    from research_agent.search.service import query_knowledge

    hits = query_knowledge(c, word, collections=[collection], mode="keyword", rerank=False, top_k=5).results
    return [h.source_document for h in hits]


def _kill_after_delete_chunks(tmp_path: Path, chroma_server, collection: str, doc: Path) -> None:
    """A `kb add-document` of the updated file SIGKILLed right after its old chunks are deleted (before the bump)."""
    env = _server_env(chroma_server, RA_TEST_KILL_AT="delete_chunks:1+")
    proc = subprocess.run(cli_argv(tmp_path, "--json", "kb", "add-document", str(doc), "--collection", collection,
                                   fake=True), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("writer_host", ["this", "other"])
def test_doctor_sees_and_repair_announces_a_write_killed_before_its_bump(tmp_path, chroma_server, fake_embedder,
                                                                         writer_host):
    """Killed between its chunk deletion and its bump, a writer left the new manifest unannounced: doctor must
    not say healthy, and `doctor --repair` (another process) makes this reader's keyword index answer the new
    text at once. A writer of another machine cannot be told dead: its intent is announced, not undone."""
    collection = _unique("kb")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 6)
        assert _keyword_docs(c, collection, "wordd3x") == ["docs/d3.txt"]  # this reader's index is built
        (docs / "d3.txt").write_text("document d3 second version freshword alpha beta\n")
        _kill_after_delete_chunks(tmp_path, chroma_server, collection, docs / "d3.txt")
        intents = c.store.registry_find("intent", collection)
        assert len(intents) == 1
        if writer_host == "other":
            key, intent = next(iter(intents.items()))
            c.store.registry_put({key: {**intent, "host": "another-machine"}}, "intent", collection)
        env = _server_env(chroma_server)
        found = json.loads(run_cli(tmp_path, "--json", "doctor", fake=True, env=env).stdout)
        assert found["healthy"] is False
        assert [ch["unfinished_writes"] for ch in found["collections"] if ch["collection"] == collection] == [1]
        repaired = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
        after = json.loads(repaired.stdout)
        assert repaired.returncode == (0 if after["healthy"] else 1), repaired.stderr[-2000:]
        assert _keyword_docs(c, collection, "freshword") == ["docs/d3.txt"]
        assert _keyword_docs(c, collection, "wordd3x") == []
        left = c.store.registry_find("intent", collection)
        if writer_host == "this":  # its process is gone: undone and cleared
            assert after["healthy"] is True and not left
        else:  # maybe alive: announced, kept until STALE_INTENT_SECONDS
            assert after["healthy"] is False and len(left) == 1
            assert any("announced 1 unfinished" in a for a in after["actions"])
        assert_chunks_of_manifests(c, collection)
    finally:
        c.close()


def assert_chunks_of_manifests(c, collection: str) -> None:
    from research_agent.storage.registry import version_ids

    expected = set(version_ids(collection, c.store.registry_find("document", collection).values()))
    assert expected <= set(c.store.get_collection(collection).get(include=[])["ids"])


@pytest.mark.slow
def test_doctor_repair_keeps_a_live_writers_young_intent_and_new_chunks(tmp_path, chroma_server, fake_embedder):
    """A write in progress (intent recorded, new chunks in, manifest not flipped yet) of a live process: repair
    announces it but deletes none of its chunks and keeps its intent, so the writer can still finish."""
    from research_agent.storage import writer
    from research_agent.storage.registry import chunk_ids

    collection = _unique("live")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 3)
        col = c.store.get_collection(collection)
        new_ids = chunk_ids(collection, "docs/d1.txt", "f" * 64, 1)
        intent = writer.write_intent(c.store, collection, [{"document": "docs/d1.txt", "content_hash": "f" * 64,
                                                             "chunk_count": 1}])
        col.upsert(ids=new_ids, embeddings=fake_embedder().embed_documents(["in progress"]),
                   documents=["in progress"], metadatas=[{"source_document": "docs/d1.txt"}])
        repaired = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=_server_env(chroma_server))
        assert repaired.returncode == 1, repaired.stderr[-2000:]
        assert json.loads(repaired.stdout)["healthy"] is False  # a write is still unfinished
        assert intent in c.store.registry_find("intent", collection)
        assert set(new_ids) <= set(col.get(ids=new_ids, include=[])["ids"])
    finally:
        c.close()


def test_only_a_writer_known_dead_on_this_machine_counts_as_gone():
    """A record's holder is gone only if it ran here (same host and pid namespace) and its pid has exited; a
    writer elsewhere, or in another container sharing the host name, may be alive (then: the 600 s rule)."""
    from research_agent.storage.leases import holder, holder_gone

    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {**holder(), "pid": int(exited.stdout)}
    assert holder_gone(dead)
    assert not holder_gone(holder())  # this process
    assert not holder_gone({**dead, "host": "another-machine"})
    assert not holder_gone({**dead, "pidns": "pid:[1]"})
    assert not holder_gone({"versions": [], "created": 0})  # an intent of an older version


@pytest.mark.slow
def test_a_live_reindex_lease_refuses_a_write_with_a_coded_error_and_a_dead_one_does_not(tmp_path, chroma_server,
                                                                                        fake_embedder):
    """Another machine's reindex (a live lease) refuses a write: StoreUnavailableError, retryable, nothing
    written and no intent left. A lease not renewed for LEASE_SECONDS, or of a process gone from this machine
    (a reindex killed -9), blocks nothing."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.ingest.service import ingest_path
    from research_agent.storage.leases import LEASE, LEASE_SECONDS, holder, lease_key

    collection = _unique("lease")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 2)
        before = c.store.registry_find("document", collection)
        (docs / "d1.txt").write_text("document d1 second version\n")
        other = {"started": time.time(), "renewed": time.time(), "host": "another-machine", "pid": 4242}
        c.store.registry_put({lease_key(collection): other}, LEASE, collection)
        with pytest.raises(StoreUnavailableError) as refused:
            ingest_path(c, docs / "d1.txt", collection)
        assert refused.value.data["retryable"] and "being reindexed" in refused.value.message
        assert "kb reindex" in refused.value.data["guidance"]
        assert c.store.registry_find("document", collection) == before
        assert not c.store.registry_find("intent", collection)
        exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                text=True)
        for dead in ({**other, "renewed": time.time() - LEASE_SECONDS - 1},
                     {**other, **holder(), "pid": int(exited.stdout)}):
            c.store.registry_put({lease_key(collection): dead}, LEASE, collection)
            (docs / "d1.txt").write_text(f"document d1 version {dead['pid']} {dead['renewed']}\n")
            assert ingest_path(c, docs / "d1.txt", collection).updated == 1
        assert_consistent(c, collection)
    finally:
        c.close()


# -- the lease and intents against other machines' clocks and against a second reindex (tester's findings 4-6) --
def test_lease_and_intent_dates_tolerate_clock_skew_but_never_absurd_ones():
    """A lease counts while now - renewed is within [-CLOCK_SKEW_SECONDS, LEASE_SECONDS]; an intent dated
    further ahead than the skew is a dead (recoverable) one, however young it claims to be."""
    from research_agent.storage.leases import CLOCK_SKEW_SECONDS, LEASE_SECONDS, intent_stale, lease_live

    now = 1_800_000_000.0
    lease = {"started": now, "host": "another-machine", "pid": 4242}
    assert lease_live({**lease, "renewed": now}, now)
    assert lease_live({**lease, "renewed": now + CLOCK_SKEW_SECONDS - 1}, now)  # a clock ahead within the skew
    assert lease_live({**lease, "renewed": now - LEASE_SECONDS + 1}, now)
    assert not lease_live({**lease, "renewed": now + CLOCK_SKEW_SECONDS + 1}, now)  # absurd: ignored
    assert not lease_live({**lease, "renewed": now - LEASE_SECONDS - 1}, now)  # not renewed: dead
    intent = {"versions": [], "host": "another-machine", "pid": 4242}
    assert not intent_stale({**intent, "created": now - 10}, 600, now)
    assert not intent_stale({**intent, "created": now + CLOCK_SKEW_SECONDS - 1}, 600, now)
    assert intent_stale({**intent, "created": now + CLOCK_SKEW_SECONDS + 1}, 600, now)
    assert intent_stale({**intent, "created": now - 600}, 600, now)
    assert intent_stale({**intent, "created": now + 5}, 0, now)  # embedded (min_age 0): every intent is dead


def _future_intent(c, collection: str, seconds_ahead: float) -> str:
    """An intent of another machine whose clock is `seconds_ahead` (the tester's fake_intent.py)."""
    from research_agent.storage.registry import INTENT, intent_key

    m = next(iter(c.store.registry_find("document", collection).values()))
    key = intent_key(collection)
    c.store.registry_put({key: {"versions": [{k: m[k] for k in ("document", "content_hash", "chunk_count")}],
                                "created": time.time() + seconds_ahead, "host": "another-machine", "pidns": None,
                                "pid": 4242}}, INTENT, collection)
    return key


@pytest.mark.slow
def test_a_future_dated_lease_or_intent_of_another_machine_blocks_nothing(tmp_path, chroma_server, fake_embedder):
    """Finding 4: a lease renewed an hour 'in the future' refused every write for an hour, and an intent dated a
    day ahead made each `kb reindex` wait LEASE_DRAIN_SECONDS twice (134 s for 53 documents) with a raw WARNING
    line on the terminal. Now: the lease is ignored, a lease ahead within the skew still refuses (with the real
    command in its guidance, finding 6), and the reindex recovers the intent and finishes at once, quietly."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.ingest.service import ingest_path
    from research_agent.storage.leases import LEASE, lease_key

    collection = _unique("skew")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 3)
        other = {"started": time.time(), "host": "another-machine", "pidns": None, "pid": 4242}
        c.store.registry_put({lease_key(collection): {**other, "renewed": time.time() + 60}}, LEASE, collection)
        (docs / "d1.txt").write_text("document d1 second version\n")
        with pytest.raises(StoreUnavailableError) as refused:
            ingest_path(c, docs / "d1.txt", collection)
        assert f"research-agent kb reindex --collection {collection}" in refused.value.data["guidance"]
        c.store.registry_put({lease_key(collection): {**other, "renewed": time.time() + 3600}}, LEASE, collection)
        assert ingest_path(c, docs / "d1.txt", collection).updated == 1
        c.store.registry_delete([lease_key(collection)])
        intent = _future_intent(c, collection, 86400)
        proc = run_cli(tmp_path, "kb", "reindex", "--collection", collection, fake=True,
                       env=_server_env(chroma_server), timeout=60)  # old code: 2 x 60 s of draining
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "research_agent.storage.leases" not in proc.stderr
        assert intent not in c.store.registry_find("intent", collection)
        c.store.refresh()
        assert_consistent(c, collection)
    finally:
        c.close()


# Takes the reindex lease of a collection at a given wall-clock time, with a pause between its look for another
# lease and its first lease write (the tester's rx_slow.py); prints "won" or "lost", holds a won lease HOLD s.
LEASE_TAKER = '''
import sys, time
from research_agent.container import build_container
from research_agent.errors import StoreUnavailableError
from research_agent.storage import leases
coll, at, pause, hold = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
c = build_container()
put, paused = c.store.registry_put, []
def slow_put(records, kind, collection):
    if kind == leases.LEASE and not paused:
        paused.append(1)
        time.sleep(pause)
    return put(records, kind, collection)
c.store.registry_put = slow_put
time.sleep(max(0.0, at - time.time()))
try:
    with leases.ReindexLease(c.store, coll, stale_intent_seconds=600):
        print("won", flush=True)
        time.sleep(hold)
except StoreUnavailableError as exc:
    print("lost", exc.message, flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize(("offset", "pause"), [(1.5, 3.0), (0.0, 0.0)], ids=["tester-timing", "same-moment"])
def test_two_reindexes_racing_for_the_lease_never_both_take_it(tmp_path, chroma_server, fake_embedder, offset,
                                                               pause):
    """Finding 5: the lease was looked for, then written: two reindexes 1.5 s apart with 3 s between look and
    write both took it (one died with NotFoundError in the swap). Never two winners: 1.5 s apart the first wins
    and the other gets the coded 'already being reindexed' error, leaving the winner's lease in place; started
    at the same moment both may lose (run again), never both win. Nothing is left behind."""
    from research_agent.storage.leases import lease_key

    collection = _unique("race")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        (tmp_path / "taker.py").write_text(LEASE_TAKER, encoding="utf-8")
        env = _server_env(chroma_server)
        at = time.time() + 8  # both processes have started (imports) by then
        procs = [subprocess.Popen([sys.executable, str(tmp_path / "taker.py"), collection, str(at + delay),
                                   str(pause), "6"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for delay in (0.0, offset)]
        outs = [p.communicate(timeout=90) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
        verdicts = [out.split()[0] for out, _ in outs]
        assert verdicts.count("won") <= 1, outs
        if offset:
            assert verdicts == ["won", "lost"], outs
        assert all("already being reindexed" in out for out, _ in outs if out.startswith("lost")), outs
        assert not c.store.registry_find("lease", collection), "a lease or claim was left behind"
        assert lease_key(collection) not in c.store.registry_get([lease_key(collection)])
    finally:
        c.close()


@pytest.mark.slow
def test_a_reindex_leaving_deletes_only_its_own_lease(tmp_path, chroma_server, fake_embedder):
    """Finding 5: ReindexLease.__exit__ deleted the lease even when another reindex had taken it over since
    (after this one's lease went unrenewed for LEASE_SECONDS): that reindex's writers were then let in. Its next
    renewal now stops it with the coded error instead of writing over the other's lease."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.leases import LEASE, LEASE_RENEW_SECONDS, ReindexLease, lease_key

    collection = _unique("own")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        takeover = {"started": time.time(), "renewed": time.time(), "host": "another-machine", "pidns": None,
                    "pid": 4242, "token": "someone-else"}
        with ReindexLease(c.store, collection, stale_intent_seconds=600) as lease:
            c.store.registry_put({lease_key(collection): takeover}, LEASE, collection)
            lease.renewed -= LEASE_RENEW_SECONDS  # its renewal is due
            with pytest.raises(StoreUnavailableError, match="already being reindexed"):
                lease.renew()
        assert c.store.registry_get([lease_key(collection)]).get(lease_key(collection)) == takeover
    finally:
        c.close()


def test_listing_collections_between_a_live_reindexs_renames_leaves_its_backup_alone(chroma_server):
    """Another machine's reindex is between its two renames (its collection exists only under the backup name):
    a process listing collections then must not give the backup its name back (that broke the reindex; the
    restore is for a reindex that died, whose lease is no longer live)."""
    import socket

    from research_agent.container import build_container
    from research_agent.storage import leases, swaps

    c = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    try:
        from research_agent.catalog import collections

        collections.create_collection(c, "swapping")
        live = c.store.get_collection("swapping")
        backup = swaps.swap_name(swaps.BACKUP_PREFIX, "swapping")
        c.store.rename_collection(live, backup)  # step 1 of the other machine's swap
        lease = {"started": time.time(), "renewed": time.time(), "host": f"not-{socket.gethostname()}",
                 "pidns": None, "pid": 4242, "token": "theirs"}
        c.store.registry_put({leases.lease_key("swapping"): lease}, leases.LEASE, "swapping")
        c.store.list_collections()
        assert backup in [col.name for col in c.store.client.list_collections()]  # left for the reindex

        c.store.registry_delete([leases.lease_key("swapping")])  # that reindex died: the next listing restores
        assert [col.name for col in c.store.list_collections()] == ["swapping"]
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.parametrize("op", ["remove", "update"])
def test_a_writer_that_resolved_the_collection_before_a_reindex_writes_the_live_one(tmp_path, chroma_server,
                                                                                  fake_embedder, monkeypatch, op):
    """A writer of another process (ignoring the lease, or paused) that looked the collection up before a reindex
    renamed it writes after the reindex ended: its flip lands in the live collection, not in the dropped
    backup. The old writer deleted the manifest, then failed on the dropped collection: orphan chunks no
    manifest names (the race behind the flaky `lease-ignored` run above)."""
    from research_agent.ingest import service
    from research_agent.ingest.service import ingest_path, reindex_collection, remove_document

    collection = _unique("stale")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 4)
        stale = c.store.get_collection(collection)  # the writer's lookup, before the reindex
        reindex_collection(c, collection)
        monkeypatch.setattr(service, "open_collection", lambda *a, **k: stale)
        if op == "remove":
            remove_document(c, collection, "docs/d1.txt")
        else:
            (docs / "d1.txt").write_text("document d1 second version wordupdatedx alpha beta\n")
            ingest_path(c, docs / "d1.txt", collection)
        monkeypatch.undo()
        c.store.refresh()
        assert_consistent(c, collection)
        names = {m["document"]: m for m in c.store.registry_find("document", collection).values()}
        assert ("docs/d1.txt" in names) is (op == "update")
        assert not c.store.registry_find("intent", collection), "an intent was left behind"
    finally:
        c.close()


@pytest.mark.slow
def test_deleting_a_collection_another_machine_reindexes_is_refused_and_a_dead_lease_blocks_nothing(tmp_path,
                                                                                                    chroma_server,
                                                                                                    fake_embedder):
    """`collections delete` deleted the reindex's lease with the collection's records; the reindex's recovery then
    took its own backup for a leftover and restored the deleted collection, with chunks no manifest names (attack
    pass of 2026-11-25). While another process's reindex holds a live lease the delete is refused (retryable,
    nothing deleted); a dead lease blocks nothing."""
    from research_agent.catalog.collections import delete_collection
    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.leases import LEASE, LEASE_SECONDS, lease_key

    collection = _unique("del")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 2)
        before = c.store.registry_find("document", collection)
        other = {"started": time.time(), "renewed": time.time(), "host": "another-machine", "pid": 4242}
        c.store.registry_put({lease_key(collection): other}, LEASE, collection)
        with pytest.raises(StoreUnavailableError) as refused:
            delete_collection(c, collection)
        assert refused.value.data["retryable"] and "being reindexed" in refused.value.message
        assert "nothing was deleted" in refused.value.message
        assert c.store.has_collection(collection) and c.store.registry_find("document", collection) == before
        assert c.store.registry_find("lease", collection), "the live reindex's lease was deleted"
        c.store.registry_put({lease_key(collection): {**other, "renewed": time.time() - LEASE_SECONDS - 1}}, LEASE,
                             collection)
        assert delete_collection(c, collection).chunks_removed == 2
        assert not c.store.has_collection(collection) and not c.store.registry_find("document", collection)
    finally:
        c.close()
