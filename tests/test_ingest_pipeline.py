"""The overlapped ingest (reading thread, embedding thread, commits in the calling thread) stores exactly what the
one-thread path stores, survives kill -9 and Ctrl-C with whole documents, and never hangs on an error in a thread.

Real embedded Chroma throughout; the equality test runs the packaged model, the others the fake embedder (the
crash and Ctrl-C tests in real CLI subprocesses, as tests/test_crash_safety.py does).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from research_agent import ingest
from research_agent.catalog import collections
from research_agent.catalog.collections import open_collection
from research_agent.errors import ConfigError
from research_agent.ingest import service
from research_agent.storage.registry import version_ids
from test_concurrency import FAKE_MODEL, TESTS_DIR, cli_env, make_folder, open_store, run_cli, snapshot
from test_crash_safety import _REFERENCE, COLLECTION, comparable, fresh_run, ingest_argv, kill_during, write_v1


def _reference(factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted run of the 500-file folder (shared with tests/test_crash_safety.py's cache)."""
    if "fresh" not in _REFERENCE:
        _REFERENCE["fresh"] = fresh_run(factory.mktemp("reference-fresh"), "fresh", 500)
    return _REFERENCE["fresh"]


def _small_files(folder: Path, files: int) -> Path:
    """Many small Markdown files (1-3 chunks each) and one empty file (skipped with its reason)."""
    make_folder(folder, files, sections=2, words=25, seed=11, tag="small")
    for i in range(0, files, 7):  # a few longer ones, so batches hold documents of different sizes
        path = folder / f"doc{i:03d}.md"
        path.write_text(path.read_text() + "\n## Long\n\n" + " ".join(f"w{i}x{j}" for j in range(300)) + "\n")
    (folder / "empty.md").write_text("")
    return folder


def _stored(c: Any, collection: str) -> dict[str, Any]:
    """Chunks (by document and sequence: text, metadata, vector) and manifests, with the collection name and
    timestamps left out, so two collections of one store compare."""
    got = open_collection(c, collection).get(include=["documents", "metadatas", "embeddings"])
    chunks = {}
    for cid, text, meta, vector in zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"]):
        meta = {k: v for k, v in meta.items() if k != "collection"}
        chunks[(meta["source_document"], meta["chunk_sequence_id"])] = (cid.split("-", 1)[1], text, meta, vector)
    manifests = {m["document"]: {k: v for k, v in m.items() if k not in ("collection", "updated_at", "added_at")}
                 for m in c.store.registry_find("document", collection).values()}
    return {"chunks": chunks, "manifests": manifests}


def _ingest_both(c: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The folder ingested into `seq` by the one-thread path and into `ovl` by the overlapped one."""
    out = {}
    for name, overlap in (("seq", False), ("ovl", True)):
        monkeypatch.setattr(service, "OVERLAP", overlap)
        events: list[ingest.IngestProgress] = []
        report = ingest.ingest_path(c, folder, name, progress=events.append)
        out[name] = (report.model_dump(exclude={"collection", "seconds"}), events)
    return out


@pytest.mark.slow
def test_overlapped_ingest_stores_exactly_what_the_sequential_path_stores(container, tmp_path, monkeypatch):
    monkeypatch.setattr(service, "EMBED_BATCH_CHUNKS", 8)  # many batches from a small folder
    folder = _small_files(tmp_path / "notes", 40)
    for name in ("seq", "ovl"):
        collections.create_collection(container, name)
    runs = [_ingest_both(container, folder, monkeypatch)]
    for i in range(0, 40, 3):  # then an update: a third changed, the rest unchanged
        (folder / f"doc{i:03d}.md").write_text(f"# Changed {i}\n\nnew text number {i} here\n")
    runs.append(_ingest_both(container, folder, monkeypatch))

    for run in runs:
        (seq_report, seq_events), (ovl_report, ovl_events) = run["seq"], run["ovl"]
        assert ovl_report == seq_report
        assert [e.files_done for e in ovl_events if e.stage == "writing"] == [
            e.files_done for e in seq_events if e.stage == "writing"]
        done = [e.chunks_done for e in ovl_events if e.stage in ("embedding", "writing", "done")]
        assert done == sorted(done) and done[-1] == ovl_report["chunks_written"]
        bar = [e.files_progress for e in ovl_events if e.stage in ("embedding", "writing", "done")]
        assert bar == sorted(bar) and all(e.files_total == 41 for e in ovl_events)
    first, second = runs[0]["ovl"][0], runs[1]["ovl"][0]
    assert first["added"] == 40 and second["updated"] == 14 and second["unchanged"] == 26
    assert runs[0]["ovl"][0]["chunks_written"] > 8 * 5, "the folder must span several batches"
    assert [p["path"] for p in runs[0]["ovl"][0]["skipped"]] == ["notes/empty.md"]

    seq, ovl = _stored(container, "seq"), _stored(container, "ovl")
    assert ovl["manifests"] == seq["manifests"]
    assert ovl["chunks"].keys() == seq["chunks"].keys()
    for key, (tail, text, meta, vector) in ovl["chunks"].items():
        assert (tail, text, meta) == seq["chunks"][key][:3], key
        assert sum(a * b for a, b in zip(vector, seq["chunks"][key][3])) > 0.9999, key  # the same model's vector
    assert len(open_collection(container, "ovl").get()["ids"]) == len(ovl["chunks"])  # no leftover old chunks


@pytest.mark.slow
@pytest.mark.parametrize("point", [
    pytest.param(("step", "ingest.service._encode_batch:3"), id="encoder-starting-batch-3"),
    pytest.param(("step", "_write_intent:2+"), id="second-commit-intent-written"),
    pytest.param(("commits", 2.0), id="after-the-second-commit"),
])
def test_kill_9_mid_overlapped_ingest_then_rerun_equals_an_uninterrupted_run(tmp_path, tmp_path_factory, point,
                                                                           fake_embedder):
    """kill -9 while the reader and the encoder are ahead of the commits, then the same command again: the store
    equals one uninterrupted run's (the reference is the one-thread-era reference of test_crash_safety)."""
    reference = _reference(tmp_path_factory)
    store, folder = tmp_path / "store", tmp_path / "corpus"
    env = cli_env(store, fake=True)
    write_v1(folder, 500)
    assert run_cli(tmp_path, "collections", "create", COLLECTION, fake=True, env=env).returncode == 0
    what = kill_during(ingest_argv(tmp_path, folder), env, tmp_path, store, point)

    again = subprocess.run(ingest_argv(tmp_path, folder), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["failed"] == []
    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        snap = snapshot(c, COLLECTION)
        got = comparable(snap)
        assert got["ids"] == reference["ids"], what
        assert got["manifests"] == reference["manifests"] and got["texts"] == reference["texts"]
        assert got["count"] == snap["manifest_chunks"] and not snap["intent"]
    finally:
        c.close()


def _ingest_in_thread(c: Any, folder: Path, name: str) -> tuple[Any, BaseException | None]:
    """ingest_path in a thread joined with a generous bound: a hang fails the test instead of stalling it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["report"] = ingest.ingest_path(c, folder, name)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the ingest hung"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("ingest-")], "threads left running"
    return out.get("report"), out.get("error")


def _whole_documents(c: Any, name: str) -> None:
    """Every manifest's chunks are all stored (no document is half written)."""
    manifests = c.store.registry_find("document", name)
    ids = set(open_collection(c, name).get()["ids"])
    assert set(version_ids(name, manifests.values())) <= ids


def test_a_parser_exception_in_the_reader_thread_skips_that_file_with_its_reason(container, fake_embedder, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr(service, "EMBED_BATCH_CHUNKS", 4)
    folder = make_folder(tmp_path / "docs", 30, sections=2, words=20, seed=3, tag="docs")
    prepare, threads = service.prepare_file, set()

    def flaky(c: Any, path: Path, document: str, **kw: Any) -> Any:
        threads.add(threading.current_thread().name)
        if path.name == "doc013.md":
            raise RuntimeError("parser bug on this file")
        return prepare(c, path, document, **kw)

    monkeypatch.setattr(service, "prepare_file", flaky)
    collections.create_collection(container, "docs")
    report, error = _ingest_in_thread(container, folder, "docs")
    assert error is None and threads == {"ingest-reader"}
    assert [(p.path, p.reason) for p in report.failed] == [("docs/doc013.md", "RuntimeError: parser bug on this file")]
    assert report.added == 29 and "docs/doc013.md" not in report.documents
    assert len(container.store.registry_find("document", "docs")) == 29
    _whole_documents(container, "docs")


@pytest.mark.parametrize("where", ["reader", "encoder"])
def test_a_model_or_store_error_in_either_thread_ends_the_run_with_it_and_whole_documents(container, fake_embedder,
                                                                                          tmp_path, monkeypatch, where):
    """A ResearchAgentError that is not the file's fault (the model, the store) stops the run with its own code, as
    in the one-thread path; batches committed before it stay whole, nothing after it is written, nothing hangs."""
    monkeypatch.setattr(service, "EMBED_BATCH_CHUNKS", 4)
    folder = make_folder(tmp_path / "docs", 30, sections=2, words=20, seed=3, tag="docs")
    boom = ConfigError("the model went away", guidance="Reload it.")
    if where == "reader":
        prepare = service.prepare_file

        def failing(c: Any, path: Path, document: str, **kw: Any) -> Any:
            if path.name == "doc020.md":
                raise boom
            return prepare(c, path, document, **kw)

        monkeypatch.setattr(service, "prepare_file", failing)
    else:
        embedder, calls = container.embedder, [0]
        embed = embedder.embed_documents

        def failing_embed(texts: list[str]) -> list[list[float]]:
            calls[0] += 1
            if calls[0] == 6:
                raise boom
            return embed(texts)

        monkeypatch.setattr(embedder, "embed_documents", failing_embed)
    collections.create_collection(container, "docs")
    report, error = _ingest_in_thread(container, folder, "docs")
    assert error is boom and report is None
    written = container.store.registry_find("document", "docs")
    assert 0 < len(written) < 30
    if where == "reader":
        assert "document:docs:docs/doc020.md" not in written
    _whole_documents(container, "docs")


SLOW_CLI = '''
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as a terminal gives it, even if the test
# process ignores SIGINT (an ignored signal is inherited; the full suite's process had it ignored by now)
sys.path.insert(0, TESTS_DIR)
from conftest import FakeEmbedder
from research_agent import embeddings


class SlowFake(FakeEmbedder):
    """The fake embedder at about a real model's pace per slice, so a Ctrl-C lands mid-ingest (0.25 s: at 0.1 s an
    unloaded CI machine once finished the folder around the signal and exited 0)."""

    def embed_documents(self, texts):
        time.sleep(0.25)
        return super().embed_documents(texts)


embeddings._cache[("sentence-transformers", MODEL, "cpu")] = SlowFake()
from research_agent.cli.main import app
app(prog_name="research-agent")
'''.replace("TESTS_DIR", repr(TESTS_DIR)).replace("MODEL", repr(FAKE_MODEL))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_mid_overlapped_ingest_stops_promptly_and_leaves_whole_documents(tmp_path, tmp_path_factory,
                                                                                fake_embedder):
    reference = _reference(tmp_path_factory)
    store, folder = tmp_path / "store", tmp_path / "corpus"
    env = cli_env(store, fake=True)
    write_v1(folder, 500)
    assert run_cli(tmp_path, "collections", "create", COLLECTION, fake=True, env=env).returncode == 0
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI, encoding="utf-8")
    argv = [sys.executable, str(script), *map(str, ingest_argv(tmp_path, folder)[2:])]
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    generation, deadline = store / ".generation", time.monotonic() + 120
    first = generation.read_text() if generation.exists() else None
    while (generation.read_text() if generation.exists() else None) == first and time.monotonic() < deadline:
        time.sleep(0.01)  # until the first batch is committed: the threads are busy with the next ones
    assert proc.poll() is None, "the ingest ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # promptly: within a slice, not the rest of the folder
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err

    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        snap = snapshot(c, COLLECTION)
        assert 0 < len(snap["manifests"]) < 500, "interrupted in the middle"
        _whole_documents(c, COLLECTION)
    finally:
        c.close()
    again = subprocess.run(ingest_argv(tmp_path, folder), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        got = comparable(snapshot(c, COLLECTION))
        assert got["ids"] == reference["ids"] and got["manifests"] == reference["manifests"]
    finally:
        c.close()
