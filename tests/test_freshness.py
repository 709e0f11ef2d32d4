"""The freshness watcher (search/freshness.py): another process's commit is caught up on notice, in the watcher's
thread, so the next query of a long-lived server does not reopen the client itself."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from research_agent.catalog import collections, notes
from research_agent.mcp.lifespan import ServerState
from research_agent.search import service
from research_agent.search.freshness import FreshnessWatcher

ROOT = Path(__file__).parents[1]
#: A watcher polls every 0.25 s; a catch-up of a tiny store takes well under a second. A bound to catch a hang.
WAIT = 60.0

CHILD_WRITE = (
    "import sys\n"
    "from research_agent.catalog import notes\n"
    "from research_agent.container import build_container\n"
    "c = build_container()\n"
    "notes.add_research(c, 'docs', 'Tardigrades survive the vacuum of space.', 'src-tardigrade',"
    " title='Tardigrade')\n"
)
#: The same write with the fake embedder the parent registered (tests/conftest.py), for the logic tests.
CHILD_WRITE_FAKE = (
    "import sys; sys.path.insert(0, sys.argv[1])\n"
    "from conftest import FakeEmbedder, FAKE_EMBEDDER\n"
    "from research_agent import embeddings\n"
    "embeddings._cache[('sentence-transformers', FAKE_EMBEDDER, 'cpu')] = FakeEmbedder()\n" + CHILD_WRITE)
CHILD_QUERY = (
    "import json\n"
    "from research_agent.container import build_container\n"
    "from research_agent.search import service\n"
    "c = build_container()\n"
    "with c.store.session():\n"
    "    res = service.query_knowledge(c, 'tardigrades vacuum', collections=['docs'], mode='hybrid', rerank=False)\n"
    "print(json.dumps([[h.content, round(h.relevance_score, 6)] for h in res.results]))\n"
)


def run_child(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], cwd=ROOT, capture_output=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def hits(c, mode: str = "hybrid") -> list[list]:
    with c.store.session():
        res = service.query_knowledge(c, "tardigrades vacuum", collections=["docs"], mode=mode, rerank=False)
    return [[h.content, round(h.relevance_score, 6)] for h in res.results]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def reopen_threads(store, monkeypatch) -> list[str]:
    """The names of the threads that reopen the store's client from now on."""
    names: list[str] = []
    real = store._reopen_if_stale

    def recorded() -> None:
        before = store.reopens
        real()
        if store.reopens > before:
            names.append(threading.current_thread().name)

    monkeypatch.setattr(store, "_reopen_if_stale", recorded)
    return names


def served(c) -> ServerState:
    c.store.client  # noqa: B018 - the server's warm-up opens the store before calls
    collections.create_collection(c, "docs")
    notes.add_research(c, "docs", "Okapis live in the Ituri rainforest and eat leaves.", "src-okapi", title="Okapi")
    return ServerState(c)


@pytest.mark.slow
def test_another_process_write_is_caught_up_by_the_watcher_not_the_query(container, monkeypatch):
    """Real model in both processes, real subprocess writer; the answer equals a fresh process's."""
    state = served(container)
    c = state.container
    try:
        assert not any("Tardigrades" in h[0] for h in hits(c))  # the keyword index is open: the watcher warms it
        threads = reopen_threads(c.store, monkeypatch)
        run_child(CHILD_WRITE)
        wait_for(lambda: state.freshness.caught_up >= 1, "the watcher's catch-up")
        assert threads == ["store-freshness"]
        after = hits(c)
        assert threads == ["store-freshness"]  # the query did not reopen again
        assert "Tardigrades" in after[0][0]
        assert after == json.loads(run_child(CHILD_QUERY))
    finally:
        state.close()
    assert not any(t.name == "store-freshness" for t in threading.enumerate())


def test_a_write_by_this_process_causes_no_reopen(container, fake_embedder):
    state = served(container)
    try:
        hits(state.container, "keyword")
        before = state.container.store.reopens
        notes.add_research(state.container, "docs", "Narwhals have one long tusk.", "src-narwhal", title="Narwhal")
        time.sleep(1.0)  # four polls
        assert state.container.store.reopens == before
        assert state.freshness.caught_up == 0
        assert "Narwhals" in service.query_knowledge(state.container, "narwhal tusk", collections=["docs"],
                                                     mode="keyword", rerank=False).results[0].content
    finally:
        state.close()


def test_the_watcher_stops_at_shutdown(container, fake_embedder):
    state = served(container)
    thread = state.freshness.thread
    assert thread is not None and thread.is_alive() and thread.daemon
    state.close()
    assert not thread.is_alive()


def test_a_cli_process_has_no_watcher(container, fake_embedder):
    collections.create_collection(container, "docs")
    hits(container, "keyword")
    assert not any(t.name == "store-freshness" for t in threading.enumerate())


def test_server_mode_has_nothing_to_watch(fake_embedder, monkeypatch):
    from research_agent.container import build_container

    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_HOST", "127.0.0.1")
    c = build_container()
    assert c.settings.server_mode
    watcher = FreshnessWatcher(c)
    assert watcher.start() is False and watcher.thread is None


@pytest.mark.parametrize("damage", ["store removed", "generation unreadable"])
def test_a_watcher_failure_is_logged_once_and_the_server_keeps_answering(container, fake_embedder, caplog, damage):
    state = served(container)
    c = state.container
    store = c.store.settings.store
    moved = store.with_name("store-away")
    try:
        hits(c, "keyword")
        with caplog.at_level(logging.WARNING, logger="research_agent.search.freshness"):
            if damage == "store removed":
                store.rename(moved)
            else:
                (store / ".generation").unlink(missing_ok=True)
                (store / ".generation").mkdir()
            wait_for(lambda: state.freshness.error is not None, "the watcher's failure")
            time.sleep(1.0)  # more polls: still one warning
        warnings = [r for r in caplog.records if r.name == "research_agent.search.freshness"]
        assert len(warnings) == 1 and "store freshness watcher" in warnings[0].getMessage()
        if damage == "store removed":
            moved.rename(store)
        else:
            (store / ".generation").rmdir()
        assert state.freshness.thread.is_alive()
        assert service.query_knowledge(c, "okapi rainforest", collections=["docs"], mode="keyword",
                                       rerank=False).results
        wait_for(lambda: state.freshness.error is None, "the watcher to recover")
    finally:
        if moved.exists():
            shutil.rmtree(store, ignore_errors=True)
            moved.rename(store)
        state.close()


def test_a_query_arriving_while_the_watcher_warms_waits_for_it(container, fake_embedder, monkeypatch):
    """Never beside the watcher's first reads (measured at 1M: 25 s instead of 7.5 s) nor before its reopen."""
    from research_agent.search import keyword_sync

    state = served(container)
    c = state.container
    real, read, warm = keyword_sync.keyword_index, c.store.revision, {}

    def slow(*args, **kwargs):
        if threading.current_thread().name == "store-freshness":
            warm["started"] = time.monotonic()
            time.sleep(1.5)
            warm["ended"] = time.monotonic()
        return real(*args, **kwargs)

    def revision(collection: str) -> str:
        if threading.current_thread().name != "store-freshness":
            warm.setdefault("query", time.monotonic())
        return read(collection)

    monkeypatch.setattr(keyword_sync, "keyword_index", slow)
    try:
        hits(c, "keyword")
        threads = reopen_threads(c.store, monkeypatch)
        run_child(CHILD_WRITE_FAKE)
        wait_for(lambda: "started" in warm, "the watcher's warm-up")
        monkeypatch.setattr(c.store, "revision", revision)
        found = hits(c, "keyword")
        assert warm["query"] >= warm["ended"]  # the query read the index only after the warm-up ended
        assert threads == ["store-freshness"] and "Tardigrades" in found[0][0]
    finally:
        state.close()


def test_a_reopen_frees_the_old_chroma_system_at_once(container, fake_embedder):
    """The old client's system sits in a reference cycle: without a collection it stayed resident until Python's
    next full collection (2.1 GB per reopen at 1M chunks; a benchmark with 10 reopens was OOM-killed at 19 GB)."""
    import gc
    import uuid
    import weakref

    collections.create_collection(container, "docs")
    hits(container, "keyword")
    old = weakref.ref(container.store.client._server)
    (container.store.settings.store / ".generation").write_text(uuid.uuid4().hex)  # another process's commit
    gc.disable()  # only the reopen's own collection may free it
    try:
        hits(container, "keyword")
        assert container.store.reopens == 1
        assert old() is None
    finally:
        gc.enable()
