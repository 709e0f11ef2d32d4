"""The revision cache behind the keyword and node indexes: one value per key at its stamp, rebuilt when the
stamp moves, and built once when concurrent first calls race (MCP tool calls run in worker threads)."""

from __future__ import annotations

import importlib
import threading
import time

from research_agent import discovery, ingest
from research_agent.catalog import collections
from research_agent.storage.revision_cache import RevisionCache

# The module, not the function of the same name that research_agent.discovery exports.
node_index = importlib.import_module("research_agent.discovery.node_index")

NOTES = """# Orchard

## Apples
- id: apples
- type: context
<!-- content -->
Apples grow in the orchard and are picked in autumn.

## Pears
- id: pears
- type: context
<!-- content -->
Pears ripen after apples.
"""
#: How long a build lasts in the race tests: long enough that both threads arrive while it runs.
BUILD_SECONDS = 0.5


def _race(n: int, call) -> list:
    """`call()` from `n` threads released together; their results (a hang fails after 60 s, not forever)."""
    barrier, results = threading.Barrier(n), [None] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_value_is_kept_at_its_stamp_and_rebuilt_when_it_moves():
    cache: RevisionCache[list[int]] = RevisionCache()
    builds: list[int] = []

    def build(rev: int):
        return lambda: builds.append(rev) or [rev]

    first = cache.get_or_build("k", 1, build(1))
    assert cache.get_or_build("k", 1, build(1)) is first and builds == [1]
    assert cache.get_or_build("k", 2, build(2)) == [2] and builds == [1, 2]
    assert cache.get("k", 1) is None  # one entry per key: the old stamp's value is gone
    cache.clear()
    assert cache.get("k", 2) is None


def test_concurrent_first_calls_build_once():
    cache: RevisionCache[object] = RevisionCache()
    builds: list[float] = []

    def build() -> object:
        builds.append(time.monotonic())
        time.sleep(BUILD_SECONDS)
        return object()

    got = _race(4, lambda: cache.get_or_build(("store", "col"), 7, build))
    assert len(builds) == 1 and all(g is got[0] for g in got)


def test_concurrent_first_discovery_calls_build_the_node_index_once(container, fake_embedder, tmp_path,
                                                                    monkeypatch):
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "orchard.md").write_text(NOTES)
    collections.create_collection(container, "orchard")
    ingest.ingest_path(container, folder, "orchard")
    monkeypatch.setattr(node_index, "_cache", RevisionCache())  # what a new process starts with
    real_build, builds = node_index._build_index, []

    def slow_build(*args, **kwargs):
        builds.append(1)
        time.sleep(BUILD_SECONDS)  # widen the window in which a second caller misses the cache
        return real_build(*args, **kwargs)

    monkeypatch.setattr(node_index, "_build_index", slow_build)
    got = _race(2, lambda: discovery.retrieve_knowledge(container, ["apples"]).nodes[0].content)
    assert len(builds) == 1
    assert all("picked in autumn" in text for text in got)
