"""A long-lived reader (the MCP server's calling pattern) never fails while another process writes (issue 11 item 9).

Real embedded Chroma on disk, a real second process writing through the library's own ingest, remove and reindex
services; the reader is this process, querying from worker threads inside `Store.session()` exactly as
mcp_server.py's `_in_session` does. The fake embedder keeps the writer fast (many commits per second); the
real-model test runs the real `research-agent` CLI as the writer.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from test_concurrency import FAKE_MODEL, TESTS_DIR, cli_env, make_folder, open_store

# The writer process: the conftest fake embedder registered as a configured model is, then rounds of
# change-a-file + ingest, remove a document, ingest again, and every other round a reindex. RA_EMBED_DELAY slows
# every embedding call (a stand-in for a real model's cost), RA_MARKS names a file that gets "start"/"end" lines
# around each reindex.
WRITER = '''
import os, random, sys, time
sys.path.insert(0, TESTS_DIR)
from pathlib import Path
from conftest import FakeEmbedder
from research_agent import embeddings

class Slow(FakeEmbedder):
    def embed_documents(self, texts):
        time.sleep(float(os.environ.get("RA_EMBED_DELAY", "0")))
        return super().embed_documents(texts)

embeddings._cache[("sentence-transformers", "test-fake-embedder", "cpu")] = Slow()
from research_agent.container import build_container
from research_agent.ingest import ingest_path, reindex_collection, remove_document

folder, rounds, only_reindex = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "reindex"
marks = os.environ.get("RA_MARKS")
c = build_container()
rng = random.Random(1)

def mark(what):
    if marks:
        with open(marks, "a") as f:
            f.write(f"{what} {time.time()}\\n")

for r in range(rounds):
    if not only_reindex:
        words = " ".join(rng.choice("alpha beta gamma retry cache socket".split()) for _ in range(40))
        (folder / f"doc{r % 6:03d}.md").write_text(f"# changed {r}\\n\\n## Section\\n\\n{words} uniqround{r}\\n")
        ingest_path(c, folder, "live", recursive=True)
        remove_document(c, "live", f"{folder.name}/doc{(r + 3) % 6:03d}.md")
        ingest_path(c, folder, "live", recursive=True)
    if only_reindex or r % 2 == 0:
        mark("start")
        reindex_collection(c, "live")
        mark("end")
print("writer done", flush=True)
'''.replace("TESTS_DIR", repr(TESTS_DIR))


def start_writer(tmp: Path, folder: Path, rounds: int, *, only_reindex: bool = False, **env: str) -> subprocess.Popen:
    script = tmp / "writer.py"
    script.write_text(WRITER, encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, str(script), str(folder), str(rounds), "reindex" if only_reindex else "mix"],
        env=cli_env(tmp / "store", fake=True, **env),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def seed_store(tmp: Path, files: int = 6):
    """A collection `live` holding a folder of `files` documents, and a Container on it (this process's reader)."""
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest import ingest_path

    folder = make_folder(tmp / "docs", files, seed=3)
    c = open_store(tmp / "store", embedding_model=FAKE_MODEL)
    create_collection(c, "live")
    ingest_path(c, folder, "live", recursive=True)
    return c, folder


class Reader:
    """Worker threads querying in a loop, as the MCP server's tool calls do; failures are kept, not raised."""

    def __init__(self, c, until, threads: int = 2, limit: float = 90.0) -> None:
        self.c, self.until, self.limit = c, until, limit
        self.failures: collections.Counter[str] = collections.Counter()
        self.tracebacks: dict[str, str] = {}
        self.done: list[tuple[float, object]] = []  # (finish time, result)
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(threads)]

    def _query(self, n: int):
        from research_agent.search.service import query_knowledge

        scope = {"collections": ["live"]} if n % 2 else {}  # default scope lists the collections too
        with self.c.store.session():
            return query_knowledge(
                self.c,
                "alpha retry cache uniqround3",
                mode=("hybrid", "keyword", "semantic")[n % 3],
                rerank=False,
                top_k=8,
                **scope,
            )

    def _loop(self, i: int) -> None:
        started, n = time.monotonic(), i
        while not self.until() and time.monotonic() - started < self.limit:
            n += 2
            try:
                result = self._query(n)
            except Exception as exc:  # noqa: BLE001 - the test counts every kind of failure
                key = f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:120]}"
                with self._lock:
                    self.failures[key] += 1
                    self.tracebacks.setdefault(key, traceback.format_exc())
                continue
            with self._lock:
                self.done.append((time.time(), result))

    def run(self) -> "Reader":
        for t in self._threads:
            t.start()
        for t in self._threads:
            t.join()
        return self

    def report(self) -> str:
        return "\n".join(f"{n} x {k}\n{self.tracebacks[k][-1500:]}" for k, n in self.failures.items())


def one_version_per_document(result) -> bool:
    """No result list mixes two versions of a document (a reader never sees half a replacement)."""
    versions: dict[str, set[str]] = {}
    for hit in result.results:
        versions.setdefault(hit.source_document, set()).add(hit.metadata.get("content_hash"))
    return all(len(v) == 1 for v in versions.values())


def test_queries_never_fail_while_another_process_ingests_removes_and_reindexes(tmp_path, fake_embedder):
    c, folder = seed_store(tmp_path)
    try:
        writer = start_writer(tmp_path, folder, rounds=12)
        reader = Reader(c, until=lambda: writer.poll() is not None).run()
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err[-3000:]
        assert not reader.failures, (
            f"{sum(reader.failures.values())} of "
            f"{sum(reader.failures.values()) + len(reader.done)} queries failed:\n{reader.report()}"
        )
        assert len(reader.done) >= 20, "the reader hardly ran while the writer wrote"
        assert all(one_version_per_document(r) for _, r in reader.done)
        # The reader saw the writer's commits as they came: the round-3 edit (uniqround3) reached its results.
        assert any("uniqround3" in h.content for _, r in reader.done for h in r.results)
        final = c.store.get_collection("live")
        assert not [n for n in c.store.swap_leftovers()], "a reindex left a working copy behind"
        assert final.count() == sum(int(m["chunk_count"]) for m in c.store.registry_find("document", "live").values())
    finally:
        c.close()


def test_reader_is_not_held_up_by_a_whole_reindex_in_another_process(tmp_path, fake_embedder):
    """A reindex re-embeds under the write lock for as long as the model takes; reads go on meanwhile."""
    c, folder = seed_store(tmp_path, files=8)
    marks = tmp_path / "marks.txt"
    try:
        # 8 documents x 0.4 s of embedding: each reindex runs for over 3 s.
        writer = start_writer(tmp_path, folder, rounds=1, only_reindex=True, RA_EMBED_DELAY="0.4", RA_MARKS=str(marks))
        reader = Reader(c, until=lambda: writer.poll() is not None, threads=1).run()
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err[-3000:]
        assert not reader.failures, reader.report()
        lines = dict(line.split() for line in marks.read_text().splitlines())
        start, end = float(lines["start"]), float(lines["end"])
        assert end - start > 3.0
        during = [t for t, _ in reader.done if start + 0.5 < t < end - 0.5]
        assert len(during) >= 3, f"only {len(during)} queries finished during a {end - start:.1f} s reindex"
        manifests = c.store.registry_find("document", "live").values()
        assert c.store.get_collection("live").count() == sum(int(m["chunk_count"]) for m in manifests) > 0
    finally:
        c.close()


@pytest.mark.slow
def test_real_cli_writer_and_real_model_reader_no_failed_query(tmp_path):
    """The issue's setting with real parts: the real CLI (real packaged model) writes, a real-model reader queries."""
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest import ingest_path

    store = tmp_path / "store"
    env = cli_env(store, fake=False)
    folder = make_folder(tmp_path / "docs", 6, seed=4)
    c = open_store(store)
    try:
        create_collection(c, "live")
        ingest_path(c, folder, "live", recursive=True)
        script = ("set -e; for r in 1; do "
                  f"echo \"# edit $r\n\nalpha retry cache uniqedit$r\" > {folder}/doc000.md; "
                  f"{sys.executable} -m research_agent kb add-folder {folder} --collection live; "
                  f"{sys.executable} -m research_agent kb remove-document docs/doc001.md --collection live; "
                  f"{sys.executable} -m research_agent kb add-folder {folder} --collection live; "
                  f"{sys.executable} -m research_agent kb reindex --collection live; done")
        writer = subprocess.Popen(["bash", "-c", script], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        reader = Reader(c, until=lambda: writer.poll() is not None, limit=240).run()
        err = writer.communicate(timeout=60)[1]
        assert writer.returncode == 0, err[-3000:]
        assert not reader.failures, reader.report()
        assert len(reader.done) >= 10
        assert all(one_version_per_document(r) for _, r in reader.done)
    finally:
        c.close()
