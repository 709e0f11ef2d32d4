"""The keyword index's catch-up across processes: kill -9 in a catch-up or in a writer, concurrent queries,
and the query API fusion uses (filters in a growing window, scores of given chunks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent.catalog import collections, notes as augment
from research_agent.catalog.collections import open_collection
from research_agent.search import service as query
from research_agent.search.keyword_index import Chunk, IndexState, KeywordIndex

TESTS = Path(__file__).parent
ANIMALS = [("Okapi", "Okapis live in the Ituri rainforest and eat leaves."),
           ("Narwhal", "Narwhals have one long tusk and live in arctic waters."),
           ("Pangolin", "Pangolins are covered in scales and eat ants in the rainforest.")]
CHILD = (
    "import json, os, signal, sys; sys.path.insert(0, sys.argv[1])\n"
    "from conftest import FakeEmbedder, FAKE_EMBEDDER\n"
    "from research_agent import embeddings\n"
    "embeddings._cache[('sentence-transformers', FAKE_EMBEDDER, 'cpu')] = FakeEmbedder()\n"
    "from research_agent.container import build_container\n"
    "from research_agent.search import keyword_index, keyword_sync, service as query\n"
    "def die(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
)
QUERY = (
    "c = build_container()\n"
    "with c.store.session():\n"
    "    res = query.query_knowledge(c, sys.argv[2], collections=['docs'], mode='keyword', rerank=False)\n"
    "print(json.dumps({'hits': [h.content for h in res.results], 'catch_ups': len(keyword_sync.RECENT),\n"
    "                  'modes': [[x.mode, len(x.documents)] for x in keyword_sync.RECENT]}))\n"
)
# The catch-up dies while adding its second chunk (segments written, nothing committed).
DIE_IN_CATCH_UP = (
    "add = keyword_index.KeywordIndex._document\n"
    "seen = []\n"
    "def dying(self, ch, doc, *state):\n"
    "    seen.append(ch.id)\n"
    "    return die() if len(seen) == 2 else add(self, ch, doc, *state)\n"
    "keyword_index.KeywordIndex._document = dying\n"
)
# ... or after every chunk and per-document state entry, while replacing the global entry (just before commit).
DIE_BEFORE_COMMIT = "keyword_index.KeywordIndex._replace_global = staticmethod(die)\n"


def child(code: str, *args: str, wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    env = dict(os.environ, RESEARCH_AGENT_EMBEDDING_MODEL="test-fake-embedder")
    argv = [sys.executable, "-c", CHILD + code, str(TESTS), *args]
    if not wait:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, timeout=120, capture_output=True, text=True)


def keyword_hits(c, text: str) -> list[str]:
    return [h.content for h in query.query_knowledge(c, text, collections=["docs"], mode="keyword",
                                                     rerank=False).results]


def contents(index: KeywordIndex) -> tuple[dict[str, tuple[str, dict]], dict[str, str], IndexState]:
    """Everything the index holds: each chunk's text and metadata, and its state (per document and global:
    revision, log position, collection id and the change records it remembers as applied)."""
    import tantivy

    searcher = index._index.searcher()
    hits = searcher.search(tantivy.Query.all_query(), limit=max(1, searcher.num_docs)).hits
    docs = [searcher.doc(addr) for _, addr in hits]
    chunks = {d["id"][0]: (d["text"][0].decode(), json.loads(d["meta"][0])) for d in docs
              if not d["id"][0].startswith(("_state", "\x00"))}
    return chunks, index.all_versions(), index.state


def fresh_build(c, tmp_path: Path) -> KeywordIndex:
    from research_agent.search import keyword_sync as sync
    from research_agent.search.keyword_index import field_weights

    fresh = KeywordIndex.open(tmp_path / "fresh", field_weights(c.settings))
    with c.store.session():
        sync.catch_up(c, "docs", open_collection(c, "docs"), fresh)
    return fresh


def current_index(c) -> KeywordIndex:
    from research_agent.search import keyword_sync as sync

    with c.store.session():
        return sync.keyword_index(c, "docs", open_collection(c, "docs"))


@pytest.fixture
def animals(container, fake_embedder):
    collections.create_collection(container, "docs")
    for title, text in ANIMALS:
        augment.add_research(container, "docs", text, f"src-{title}", title=title)
    return container


@pytest.mark.parametrize("built_before, dying", [(True, DIE_IN_CATCH_UP), (False, DIE_IN_CATCH_UP),
                                                 (True, DIE_BEFORE_COMMIT)],
                         ids=["incremental", "first-build", "incremental-before-commit"])
def test_a_catch_up_killed_midway_then_run_again_equals_an_uninterrupted_one(animals, tmp_path, monkeypatch,
                                                                             built_before, dying):
    from research_agent.search import keyword_sync as sync

    if built_before:
        assert keyword_hits(animals, "okapi")
    for i, text in enumerate(["Tardigrades survive in space.", "Quokkas smile on islands.", "Axolotls regrow."]):
        augment.add_research(animals, "docs", text, f"src-new{i}", title=f"New {i}")
    out = child(dying + QUERY, "tardigrade")
    assert out.returncode == -9, out.stderr[-2000:]
    monkeypatch.setattr(sync, "_open", {})  # this process opens the folder the killed one wrote in
    assert keyword_hits(animals, "tardigrade")[0].startswith("Tardigrades")
    assert contents(current_index(animals)) == contents(fresh_build(animals, tmp_path))


WRITER_DIES_BEFORE_BUMP = (
    "from research_agent import ingest\n"
    "from research_agent.storage.registry import RegistryMixin\n"
    "RegistryMixin.bump_revision = die\n"
    "ingest.ingest_path(build_container(), 'notes.md', 'docs')\n"
)


def test_a_writer_killed_between_manifest_flip_and_revision_bump_is_caught_up_after_recovery(
        container, fake_embedder, tmp_path):
    """Trigger: the old order cleared the intent before bumping the revision, so a writer killed in between left
    flipped manifests no revision announced, and recovery found nothing: the index served the old text."""
    from research_agent import ingest

    collections.create_collection(container, "docs")
    doc = Path("notes.md")
    doc.write_text("# Notes\n\nThe zebras graze on the savanna.\n")
    ingest.ingest_path(container, doc, "docs")
    assert keyword_hits(container, "zebra")
    doc.write_text("# Notes\n\nThe giraffes browse acacia trees.\n")
    out = subprocess.run([sys.executable, "-c", CHILD + WRITER_DIES_BEFORE_BUMP, str(TESTS)], timeout=120,
                         env=dict(os.environ, RESEARCH_AGENT_EMBEDDING_MODEL="test-fake-embedder"),
                         capture_output=True, text=True)
    assert out.returncode == -9, out.stderr[-2000:]
    col = open_collection(container, "docs")
    with container.store.write_lock():
        ingest.recover_interrupted(container, "docs", col)
    assert any("giraffes" in t for t in keyword_hits(container, "giraffe"))
    assert not any("zebras" in t for t in keyword_hits(container, "zebra"))
    assert contents(current_index(container)) == contents(fresh_build(container, tmp_path))


def test_two_processes_querying_after_a_write_both_succeed_and_one_catches_up(animals):
    assert keyword_hits(animals, "okapi")
    augment.add_research(animals, "docs", "Tardigrades survive in space.", "src-t", title="Tardigrade")
    procs = [child(QUERY, "tardigrade", wait=False) for _ in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-2000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(r["hits"] and r["hits"][0].startswith("Tardigrades") for r in results)
    assert sorted(r["catch_ups"] for r in results) == [0, 1]  # the other waited for it, or found it done


def test_a_write_by_another_process_is_seen_without_a_rebuild(animals):
    from research_agent.search import keyword_sync as sync

    assert keyword_hits(animals, "okapi")
    sync.RECENT.clear()  # a bounded deque (100): after a full suite, len() stays 100 and a slice from it is empty
    before = 0
    child("from research_agent.catalog import notes\n"
          "notes.add_research(build_container(), 'docs', 'Narwhal calves follow the pod.', 'src-n2', title='Calf')\n")
    assert keyword_hits(animals, "calves")[0].startswith("Narwhal calves")
    (done,) = list(sync.RECENT)[before:]
    assert done.mode == "log" and len(done.documents) == 1 and done.chunks == 1


# -- the query API ------------------------------------------------------------------------------
def test_a_filter_finds_its_chunks_below_many_better_rejected_ones():
    """Post-filtering a growing window returns what masking every chunk before the cut returned."""
    chunks = [Chunk(f"a{i}", "zebra " * 5 + f"filler {i}", {"source_document": "a"}) for i in range(1000)]
    chunks += [Chunk(f"b{i}", f"zebra and many other words here {i} " * 3, {"source_document": "b"})
               for i in range(3)]
    index = KeywordIndex(chunks)
    hits = index.search("zebra", 2, where=lambda m: m["source_document"] == "b")
    assert [ch.id for ch, _ in hits] == ["b0", "b1"] or {ch.id for ch, _ in hits} <= {"b0", "b1", "b2"}
    assert len(hits) == 2 and all(ch.metadata["source_document"] == "b" for ch, _ in hits)
    assert index.search("zebra", 5, where=lambda m: m["source_document"] == "c") == []


def test_scores_of_given_chunks_equal_their_ranked_scores():
    index = KeywordIndex([Chunk("a", "okapi rainforest leaves", {}), Chunk("b", "okapi", {}),
                          Chunk("c", "narwhal tusk", {})])
    ranking = index.rank("okapi leaves")
    top = {ch.id: score for ch, score in index.top(ranking, 10)}
    assert set(top) == {"a", "b"} and top["a"] > top["b"] > 0
    assert index.scores_of(ranking, ["b", "c", "a", "missing"]) == {"a": top["a"], "b": top["b"], "c": 0.0,
                                                                     "missing": 0.0}
    assert index.scores_of(index.rank("zzzz"), ["a"]) == {"a": 0.0}


def test_concurrent_first_queries_in_threads_build_once(animals, monkeypatch):
    """MCP tool calls run in worker threads: the first queries of a new process share one build."""
    import threading

    from research_agent.search import keyword_sync as sync

    monkeypatch.setattr(sync, "_open", {})  # no index yet either: the fixture only wrote
    sync.RECENT.clear()  # bounded (100): a slice from len() is empty once it is full (the full suite)
    before, barrier, results = 0, threading.Barrier(4), []

    def run() -> None:
        barrier.wait()
        with animals.store.session():
            results.append(keyword_hits(animals, "narwhal"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 4 and all(r and r[0].startswith("Narwhals") for r in results)
    assert [c.mode for c in list(sync.RECENT)[before:]] == ["build"]


def test_each_documents_state_is_replaced_with_its_chunks_and_a_chunkless_one_is_kept_alone():
    """Per-document state (layout 3): written with the document's entries, removed by the same delete, and
    a document with no chunk still has its state (else every full diff would re-apply it)."""
    from research_agent.search.keyword_index import IndexState

    index = KeywordIndex()
    two = [("a", Chunk("a0", "okapi rainforest", {})), ("a", Chunk("a1", "okapi leaves", {}))]
    index.apply([], two + [("b", Chunk("b0", "narwhal tusk", {}))], IndexState("r1", 1),
                {"a": "ha", "b": "hb", "empty": "he"})
    assert index.all_versions() == {"a": "ha", "b": "hb", "empty": "he"}
    assert len(index) == 3 and index.versions_of(["a", "missing"]) == {"a": "ha"}
    assert not index.search("he", 5) and index.state == IndexState("r1", 1)
    done = index.apply(["a", "empty"], [("a", Chunk("a2", "okapi stripes", {}))], IndexState("r2", 2), {"a": "h2"})
    assert index.all_versions() == {"a": "h2", "b": "hb"} and len(index) == 2
    assert [ch.id for ch, _ in index.search("okapi", 5)] == ["a2"]
    assert (done.chunks, done.entries) == (1, 2) and index.state == IndexState("r2", 2)


STEP = (
    "from research_agent import ingest\n"
    "from research_agent.catalog import collections\n"
    "c = build_container()\n"
    "ops = json.loads(sys.argv[2])\n"
    "keyword_sync.EMBEDDED_SKEW_SECONDS = 0  # the steps run within 2 s; the tester's were minutes apart\n"
    "if ops.get('create'):\n"
    "    collections.create_collection(c, 'docs')\n"
    "for name, text in ops.get('write', []):\n"
    "    open(name, 'w').write(text)\n"
    "    ingest.ingest_path(c, name, 'docs')\n"
    "with c.store.session():\n"
    "    found = {q: sorted(h.content.strip() for h in query.query_knowledge(\n"
    "        c, q, collections=['docs'], mode='keyword', rerank=False).results) for q in ops['ask']}\n"
    "print(json.dumps({'found': found, 'modes': [u.mode for u in keyword_sync.RECENT]}))\n"
)


def step(**ops) -> dict:
    out = child(STEP, json.dumps(ops))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _chroma_files(store: Path, to: Path) -> None:
    """Copy the store without its keyword index (what a backup of the Chroma files holds)."""
    import shutil

    shutil.copytree(store, to, ignore=lambda d, names: ["keyword-index"] if Path(d) == store else [])


def test_an_index_newer_than_a_restored_store_is_reconciled_not_trusted(tmp_path):
    """Trigger (outside tester): the Chroma files restored from a backup, the newer keyword index kept (on a
    Chroma server the index lives in the client's cache, so this happens by itself). The next write's change
    record announced the current revision, so the catch-up re-applied that write alone and kept serving the
    restore-undone text: `brandnewtextone` found r1, `oldtext` did not. Each step is a new process, and the
    files are copied while none has the store open."""
    import shutil

    store = Path(os.environ["RESEARCH_AGENT_STORE"])
    texts = {f"r{i}.md": f"oldtext {w}\n" for i, w in [(1, "alpha"), (2, "beta"), (3, "gamma")]}
    first = step(create=True, write=sorted(texts.items()), ask=["oldtext"])
    assert first["found"]["oldtext"] == ["oldtext alpha", "oldtext beta", "oldtext gamma"]
    _chroma_files(store, tmp_path / "backup")
    second = step(write=[["r1.md", "brandnewtextone\n"]], ask=["brandnewtextone"])
    assert (second["found"], second["modes"]) == ({"brandnewtextone": ["brandnewtextone"]}, ["log"])
    for entry in store.iterdir():  # the restore: Chroma files back, the (newer) keyword index kept
        if entry.name != "keyword-index":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for entry in (tmp_path / "backup").iterdir():
        (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, store / entry.name)
    last = step(write=[["r2.md", "oldtext beta two\n"]], ask=["brandnewtextone", "oldtext"])
    assert last["found"] == {"brandnewtextone": [], "oldtext": ["oldtext alpha", "oldtext beta two", "oldtext gamma"]}
    assert last["modes"] == ["diff"]  # the index's revision is not in the restored log: every manifest compared


def test_after_a_reindex_another_process_catches_up_the_next_write_by_the_log(animals, tmp_path):
    """Trigger: `kb reindex` bumped the revision with no change record, so after its next write every process's
    catch-up compared every manifest (~7 s at 1M documents) because the index's own revision was in no record.
    Now the bump writes a reset record: the new collection's index is built once, then the log carries on."""
    from research_agent import ingest

    assert keyword_hits(animals, "okapi")  # the index of the collection before the swap
    ingest.reindex_collection(animals, "docs")
    assert keyword_hits(animals, "okapi")[0].startswith("Okapis")  # the swapped-in collection's, built
    augment.add_research(animals, "docs", "Tardigrades survive in space.", "src-t", title="Tardigrade")
    out = child(QUERY, "tardigrade")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["hits"] and got["hits"][0].startswith("Tardigrades")
    assert got["modes"] == [["log", 1]]
    assert contents(current_index(animals)) == contents(fresh_build(animals, tmp_path))  # nothing stale


def test_doctors_repair_is_caught_up_by_the_log_naming_the_documents_it_dropped(animals):
    """Trigger: `doctor --repair` bumped the revision with no change record (a full manifest diff in every
    process). It now logs the incomplete documents whose manifests it drops: one document's catch-up."""
    from research_agent.ops.doctor import run_doctor
    from research_agent.search import keyword_sync as sync
    from research_agent.storage.registry import version_ids

    assert keyword_hits(animals, "okapi")
    col = open_collection(animals, "docs")
    okapi = next(m for m in animals.store.registry_find("document", "docs").values() if m.get("title") == "Okapi")
    col.delete(ids=version_ids("docs", [okapi]))  # its chunks lost behind the store's back: incomplete
    assert run_doctor(animals, repair=True).healthy
    sync.RECENT.clear()
    assert not any("Okapis" in t for t in keyword_hits(animals, "okapi rainforest"))
    assert [(x.mode, x.documents, x.chunks) for x in sync.RECENT] == [("log", [okapi["document"]], 0)]
    assert keyword_hits(animals, "narwhal")[0].startswith("Narwhals")


def test_a_reset_record_makes_the_next_catch_up_a_full_diff_once(animals, monkeypatch):
    """A reset record (a bump no write names: a restored reindex backup) is read as "compare every manifest";
    the diff's index then holds the reset's revision, so the next write is caught up by the log again."""
    from research_agent.search import keyword_sync as sync

    assert keyword_hits(animals, "okapi")
    okapi = next(k for k, m in animals.store.registry_find("document", "docs").items() if m.get("title") == "Okapi")
    animals.store.registry_delete([okapi])  # removed behind the log's back, then announced by a reset only
    animals.store.bump_revision("docs")
    sync.RECENT.clear()
    assert not any("Okapis" in t for t in keyword_hits(animals, "okapi"))
    augment.add_research(animals, "docs", "Tardigrades survive in space.", "src-t", title="Tardigrade")
    monkeypatch.setattr(sync, "EMBEDDED_SKEW_SECONDS", 0)  # the reset is older than the window (2 s otherwise)
    assert keyword_hits(animals, "tardigrade")[0].startswith("Tardigrades")
    assert [(x.mode, len(x.documents)) for x in sync.RECENT] == [("diff", 1), ("log", 1)]
