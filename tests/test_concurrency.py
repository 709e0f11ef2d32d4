"""Many processes, one store: writers serialized, nothing lost or duplicated, readers see committed writes.

Everything here is real: CLI subprocesses, embedded Chroma on disk, a `chroma run` server, an MCP stdio
server. Some writers run the real CLI with a deterministic fake embedder registered in the process (a
tiny wrapper script), so that many files can be written in seconds; the headline test uses the real
packaged embedding model.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_MODEL = "test-fake-embedder"
TESTS_DIR = str(Path(__file__).resolve().parent)

# The real CLI, with the deterministic hashing embedder of conftest.FakeEmbedder registered in the loader's
# cache exactly as the `fake_embedder` fixture does it in-process.
FAKE_CLI = '''
import sys
sys.path.insert(0, TESTS_DIR)
from conftest import FakeEmbedder
from research_agent import embeddings

embeddings._cache[("sentence-transformers", "test-fake-embedder", "cpu")] = FakeEmbedder()

# Crash tests: RA_TEST_KILL_AT="<function of research_agent.ingest.service>:<n>[+]" SIGKILLs this process at the
# n-th call of that write step (after it returns with "+"); "prune" kills the prune's chunk deletion. A dotted
# name reaches other modules' write steps: "storage.store.Store.rename_collection:1+" (submodules are imported).
import importlib, os, signal
kill_at = os.environ.get("RA_TEST_KILL_AT")
if kill_at:
    from research_agent.ingest import service as ingest  # the module whose globals the write path reads

    owner = ingest

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if kill_at == "prune":
        original_delete_documents = ingest.delete_documents

        def delete_documents(*args, **kwargs):
            ingest.delete_chunks = die
            return original_delete_documents(*args, **kwargs)

        ingest.delete_documents = delete_documents
    else:
        name, _, nth = kill_at.partition(":")
        if "." in name:
            module, *attrs = name.split(".")
            owner = importlib.import_module("research_agent." + module)
            for attr in attrs[:-1]:
                owner = getattr(owner, attr, None) or importlib.import_module(f"{owner.__name__}.{attr}")
            name = attrs[-1]
        after, nth = nth.endswith("+"), int(nth.rstrip("+"))
        original, calls = getattr(owner, name), [0]

        def hooked(*args, **kwargs):
            calls[0] += 1
            if calls[0] == nth and not after:
                die()
            result = original(*args, **kwargs)
            if calls[0] == nth:
                die()
            return result

        setattr(owner, name, hooked)

from research_agent.cli.main import app
app(prog_name="research-agent")
'''
FAKE_CLI = FAKE_CLI.replace("TESTS_DIR", repr(TESTS_DIR))

WORDS = ("alpha beta gamma delta retry cache socket timeout vector index chunk parser lock writer reader "
         "manifest embedding backoff queue shard replica").split()


def make_folder(folder: Path, files: int, *, sections: int = 2, words: int = 30, seed: int = 0,
                tag: str | None = None) -> Path:
    """`files` Markdown files with `sections` sections each; every section carries a unique word."""
    rng = random.Random(seed)
    tag = tag or folder.name
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        parts = [f"# {tag} document {i}\n"]
        for s in range(sections):
            text = " ".join(rng.choice(WORDS) for _ in range(words))
            parts.append(f"\n## Section {s}\n\n{text} uniq{tag}n{i}s{s}\n")
        (folder / f"doc{i:03d}.md").write_text("".join(parts), encoding="utf-8")
    return folder


def cli_env(store: Path | None, *, fake: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    if store is not None:
        env["RESEARCH_AGENT_STORE"] = str(store)
    if fake:
        env["RESEARCH_AGENT_EMBEDDING_MODEL"] = FAKE_MODEL
    env.update(extra)
    return env


def cli_argv(tmp: Path, *args: str, fake: bool) -> list[str]:
    if fake:
        script = tmp / "fake_cli.py"
        if not script.exists():
            script.write_text(FAKE_CLI, encoding="utf-8")
        return [sys.executable, str(script), *map(str, args)]
    return [sys.executable, "-m", "research_agent", *map(str, args)]


def run_cli(
    tmp: Path, *args: str, fake: bool, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(tmp, *args, fake=fake), env=env, cwd=tmp, capture_output=True, text=True,
                          timeout=timeout)


def expected_chunk_ids(collection: str, folder: Path, chunk_max_tokens: int = 350) -> set[str]:
    """The chunk ids a single uninterrupted run produces, computed with the library's own parser and chunker."""
    from research_agent.ingest import chunk_ids, content_hash, source_name
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import parse_file

    ids: set[str] = set()
    for path in sorted(folder.rglob("*.md")):
        doc = source_name(path, folder)
        chunks = chunk_document(parse_file(path, max_bytes=5 * 2**20), source=doc, max_tokens=chunk_max_tokens)
        ids.update(chunk_ids(collection, doc, content_hash(path.read_bytes()), len(chunks)))
    return ids


def open_store(store: Path | None = None, **overrides: Any):
    """A fresh Container on the store (Chroma's per-path system cache cleared first, so it sees other processes)."""
    from chromadb.api.shared_system_client import SharedSystemClient

    from research_agent.config import load_settings
    from research_agent.container import Container

    SharedSystemClient.clear_system_cache()
    if store is not None:
        overrides["store"] = store
    return Container(load_settings(**overrides))


def snapshot(c, collection: str) -> dict[str, Any]:
    """What the store holds for `collection`, checked for readability on the way."""
    col = c.store.get_collection(collection)
    got = col.get(include=["embeddings", "metadatas", "documents"])
    ids = got["ids"]
    embeddings = got["embeddings"]
    assert embeddings is not None and len(embeddings) == len(ids)
    dims = {len(e) for e in embeddings}
    assert len(dims) <= 1, f"mixed embedding dimensions {dims}"
    for cid, emb in zip(ids, embeddings):
        assert emb is not None and all(math.isfinite(float(v)) for v in emb), cid
        assert abs(sum(float(v) ** 2 for v in emb) - 1.0) < 1e-3, f"{cid}: not a unit vector"
    manifests = c.store.registry_find("document", collection)
    intent = c.store.registry_find("intent", collection)
    return {
        "count": col.count(),
        "ids": set(ids),
        "texts": dict(zip(ids, got["documents"])),
        "manifests": {k: {f: v for f, v in m.items() if f not in ("updated_at", "added_at")}
                      for k, m in manifests.items()},
        "manifest_chunks": sum(int(m["chunk_count"]) for m in manifests.values()),
        "intent": intent,
        "embeddings": dict(zip(ids, embeddings)),
    }


def assert_self_recall(c, collection: str, snap: dict[str, Any], sample: int = 20) -> None:
    """The vector index answers: each sampled chunk's own embedding finds it first."""
    col = c.store.get_collection(collection)
    ids = sorted(snap["ids"])
    for cid in random.Random(0).sample(ids, min(sample, len(ids))):
        res = col.query(query_embeddings=[list(map(float, snap["embeddings"][cid]))], n_results=3,
                        include=["distances"])
        assert res["distances"][0][0] < 1e-3, (cid, res)
        assert cid in res["ids"][0], (cid, res["ids"])


# -- two real-model CLI writers into one embedded store, with a long-lived MCP reader -------------------
@pytest.mark.slow
def test_two_cli_writers_real_model_one_store_exact_counts_and_mcp_reader_sees_writes(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_mcp_stdio import _McpStdioSession

    store = tmp_path / "store"
    a = make_folder(tmp_path / "alpha", 40, sections=1, words=20, seed=1)
    b = make_folder(tmp_path / "bravo", 40, sections=1, words=20, seed=2)
    env = cli_env(store, fake=False)
    created = run_cli(tmp_path, "--json", "collections", "create", "shared", fake=False, env=env)
    assert created.returncode == 0, created.stderr

    # A long-lived reader: the MCP server opened the store before anybody wrote to the collection.
    server_env = {**env, "RESEARCH_AGENT_WARMUP": "false", "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                  "XDG_DATA_HOME": str(tmp_path / "data")}
    mcp = _McpStdioSession(tmp_path, server_env)
    try:
        mcp.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": {"name": "concurrency-test", "version": "0"}})
        mcp.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

        def keyword_hits(request_id: int, word: str) -> list[str]:
            reply = mcp.request(request_id, "tools/call", {"name": "query_knowledge_base", "arguments": {
                "query": word, "collections": ["shared"], "mode": "keyword", "rerank": False, "top_k": 5}})
            assert "result" in reply and not reply["result"]["isError"], reply
            return [h["source_document"] for h in reply["result"]["structuredContent"]["results"]]

        assert keyword_hits(2, "uniqbravon7s0") == []

        procs = [subprocess.Popen(cli_argv(tmp_path, "--json", "kb", "add-folder", folder, "--collection", "shared",
                                           fake=False),
                                  env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for folder in (a, b)]
        outs = [p.communicate(timeout=400) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-3000:]
            report = json.loads(out)
            assert report["added"] == 40 and not report["failed"] and not report["skipped"], report

        # The reader's next query sees both processes' writes.
        assert keyword_hits(3, "uniqbravon7s0") == ["bravo/doc007.md"]
        assert keyword_hits(4, "uniqalphan39s0") == ["alpha/doc039.md"]

    finally:
        mcp.close()

    expected = expected_chunk_ids("shared", a) | expected_chunk_ids("shared", b)
    c = open_store(store)
    try:
        snap = snapshot(c, "shared")
        assert snap["ids"] == expected
        assert snap["count"] == len(snap["ids"]) == snap["manifest_chunks"] == len(expected) == 80
        assert len(snap["manifests"]) == 80 and not snap["intent"]
        assert {len(e) for e in snap["embeddings"].values()} == {384}
        assert_self_recall(c, "shared", snap)
        from research_agent.ops.doctor import run_doctor

        assert run_doctor(c).healthy
    finally:
        c.close()


def test_three_fake_model_writers_with_many_batches_interleave_without_loss(tmp_path, fake_embedder):
    """Bigger runs (several write batches each, so the writers really take turns at the lock)."""
    store = tmp_path / "store"
    env = cli_env(store, fake=True)
    folders = [make_folder(tmp_path / f"w{n}", 150, sections=3, words=40, seed=n) for n in range(3)]
    assert run_cli(tmp_path, "collections", "create", "many", fake=True, env=env).returncode == 0
    procs = [subprocess.Popen(cli_argv(tmp_path, "--json", "kb", "add-folder", f, "--collection", "many", fake=True),
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in folders]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out)["chunks_written"] == 450
    expected = set().union(*(expected_chunk_ids("many", f) for f in folders))
    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        snap = snapshot(c, "many")
        assert snap["ids"] == expected
        assert snap["count"] == snap["manifest_chunks"] == len(expected) == 1350
        assert_self_recall(c, "many", snap)
        from research_agent.search.service import query_knowledge

        hits = query_knowledge(c, "uniqw2n149s2", collections=["many"], mode="keyword", rerank=False).results
        assert [h.source_document for h in hits] == ["w2/doc149.md"]
    finally:
        c.close()


def test_waiting_writer_times_out_with_retryable_exit_3_when_lock_is_held(tmp_path, fake_embedder):
    from filelock import FileLock

    store = tmp_path / "store"
    env = cli_env(store, fake=True, RESEARCH_AGENT_LOCK_TIMEOUT="1.5")
    folder = make_folder(tmp_path / "docs", 5, seed=4)
    assert run_cli(tmp_path, "collections", "create", "locked", fake=True, env=env).returncode == 0
    lock = FileLock(str(store / ".write.lock"))
    with lock.acquire(timeout=5):
        started = time.monotonic()
        blocked = run_cli(tmp_path, "--json", "kb", "add-folder", folder, "--collection", "locked", fake=True, env=env)
        waited = time.monotonic() - started
    assert blocked.returncode == 3, (blocked.returncode, blocked.stderr)
    assert blocked.stdout == ""
    assert "Traceback" not in blocked.stderr
    error = json.loads(blocked.stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == -32001 and error["type"] == "StoreUnavailableError"
    assert error["data"]["retryable"] is True and error["data"]["guidance"]
    assert "locked" in error["message"]
    assert waited >= 1.5

    # Nothing was half-written, and once the lock is free the same command succeeds.
    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        assert c.store.get_collection("locked").count() == 0
    finally:
        c.close()
    done = run_cli(tmp_path, "--json", "kb", "add-folder", folder, "--collection", "locked", fake=True, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["added"] == 5


def test_long_lived_container_sees_another_process_write_on_its_next_query(tmp_path, fake_embedder):
    from research_agent.search.service import query_knowledge

    store = tmp_path / "store"
    env = cli_env(store, fake=True)
    first = make_folder(tmp_path / "first", 3, seed=5)
    second = make_folder(tmp_path / "second", 3, seed=6)
    assert run_cli(tmp_path, "collections", "create", "live", fake=True, env=env).returncode == 0
    assert run_cli(tmp_path, "kb", "add-folder", first, "--collection", "live", fake=True, env=env).returncode == 0

    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        def sources(word: str, mode: str) -> list[str]:
            return [h.source_document for h in
                    query_knowledge(c, word, collections=["live"], mode=mode, rerank=False, top_k=3).results]

        assert sources("uniqfirstn1s0", "keyword") == ["first/doc001.md"]
        assert sources("uniqsecondn2s1", "keyword") == []
        out = run_cli(tmp_path, "kb", "add-folder", second, "--collection", "live", fake=True, env=env)
        assert out.returncode == 0, out.stderr
        assert sources("uniqsecondn2s1", "keyword") == ["second/doc002.md"]
        assert "second/doc002.md" in sources("uniqsecondn2s1 second document 2", "semantic")
        # A removal by another process disappears from the next query too.
        removed = run_cli(tmp_path, "kb", "remove-document", "second/doc002.md", "--collection", "live", fake=True,
                          env=env)
        assert removed.returncode == 0, removed.stderr
        # (typo tolerance may offer the neighbours uniqsecondn0s1/n1s1, never the removed document)
        assert "second/doc002.md" not in sources("uniqsecondn2s1", "keyword")
        assert c.store.get_collection("live").count() == 10
    finally:
        c.close()


# -- four writers through a Chroma server -------------------------------------------------------------
@pytest.mark.slow
def test_four_concurrent_writers_through_chroma_server_counts_exact(tmp_path, chroma_server, fake_embedder):
    env = cli_env(None, fake=True, RESEARCH_AGENT_CHROMA_HOST=chroma_server["host"],
                  RESEARCH_AGENT_CHROMA_PORT=str(chroma_server["port"]))
    name = f"srv-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    assert run_cli(tmp_path, "collections", "create", name, fake=True, env=env).returncode == 0
    folders = [make_folder(tmp_path / f"s{n}", 100, sections=3, words=40, seed=10 + n) for n in range(4)]
    procs = [subprocess.Popen(cli_argv(tmp_path, "--json", "kb", "add-folder", f, "--collection", name, fake=True),
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in folders]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out)["chunks_written"] == 300
    expected = set().union(*(expected_chunk_ids(name, f) for f in folders))
    c = open_store(None, chroma_host=chroma_server["host"], chroma_port=chroma_server["port"],
                   embedding_model=FAKE_MODEL)
    try:
        snap = snapshot(c, name)
        assert snap["count"] == len(snap["ids"]), "duplicate ids"
        assert snap["ids"] == expected, (f"lost {len(expected - snap['ids'])}, "
                                         f"extra {len(snap['ids'] - expected)}")
        assert snap["manifest_chunks"] == len(expected) == 1200 and len(snap["manifests"]) == 400
        assert_self_recall(c, name, snap)
        from research_agent.ops.doctor import run_doctor

        report = run_doctor(c)
        assert [ch for ch in report.collections if ch.collection == name][0].orphan_chunks == 0
    finally:
        c.close()
