"""Issue 11 items 4, 5, 6, 9, 14: what a crash, a race or a dead Chroma server leaves, and the way back.

Real CLI subprocesses (the fake embedder registered in them, see test_concurrency.FAKE_CLI), real embedded
Chroma, a real `chroma run` server. The crash states are reproduced exactly as a kill -9 leaves them; the
crash-point harness (test_crash_harness.py) reaches the same states by really killing the commands.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import free_port, start_chroma
from test_concurrency import FAKE_MODEL, cli_argv, cli_env, make_folder, open_store, run_cli

NAME = "kbase"


def _error(proc: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return json.loads(proc.stderr.strip().splitlines()[-1])["error"]


def _ingested_store(tmp_path: Path, files: int = 6) -> tuple[dict[str, str], Path]:
    env = cli_env(tmp_path / "store", fake=True)
    folder = make_folder(tmp_path / "docs", files, seed=3)
    assert run_cli(tmp_path, "collections", "create", NAME, fake=True, env=env).returncode == 0
    done = run_cli(tmp_path, "kb", "add-folder", folder, "--collection", NAME, fake=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return env, folder


def _chunk_count(tmp_path: Path, name: str = NAME) -> int:
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:
        return c.store.get_collection(name).count()
    finally:
        c.close()


def _raw_names(tmp_path: Path) -> set[str]:
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:
        return {col.name for col in c.store.client.list_collections()}
    finally:
        c.close()


def _leave_reindex_between_renames(tmp_path: Path, *, with_tmp: bool = True) -> None:
    """The state a kill -9 between a reindex's two renames leaves: the collection only under its backup name."""
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:
        with c.store.write_lock():
            col = c.store.client.get_collection(NAME, embedding_function=None)
            if with_tmp:  # the re-embedded copy, complete but never renamed
                tmp = c.store.client.create_collection(f"research-agent-tmp-0badf00d-{NAME}",
                                                       metadata=dict(col.metadata), embedding_function=None)
                got = col.get(include=["embeddings", "documents", "metadatas"])
                tmp.upsert(ids=got["ids"], embeddings=got["embeddings"], documents=got["documents"],
                           metadatas=got["metadatas"])
            col.modify(name=f"research-agent-old-1234abcd-{NAME}")
    finally:
        c.close()


# -- item 4: reindex racing add-folder ---------------------------------------------------------------------
def test_reindex_reads_manifests_under_the_lock_so_a_racing_ingest_loses_nothing(tmp_path, fake_embedder):
    """A batch committed by another process while reindex loads its model is copied, not dropped forever."""
    from research_agent.ingest import reindex_collection
    from research_agent.ops.doctor import run_doctor
    from research_agent.search.service import query_knowledge

    env, _ = _ingested_store(tmp_path)
    late = make_folder(tmp_path / "late", 4, seed=9)
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    original = c.store.write_lock
    raced: list[int] = []

    def racing_write_lock():
        if not raced:  # the other writer commits just before reindex gets the lock
            out = run_cli(tmp_path, "kb", "add-folder", late, "--collection", NAME, fake=True, env=env)
            raced.append(out.returncode)
        return original()

    try:
        c.store.write_lock = racing_write_lock
        reindex_collection(c, NAME)
        c.store.write_lock = original
        assert raced == [0]
        assert c.store.get_collection(NAME).count() == 12 + 8
        hits = query_knowledge(c, "uniqlaten2s1", collections=[NAME], mode="keyword", rerank=False).results
        assert [h.source_document for h in hits][:1] == ["late/doc002.md"]
        assert run_doctor(c).healthy
    finally:
        c.close()
    again = run_cli(tmp_path, "--json", "kb", "add-folder", late, "--collection", NAME, fake=True, env=env)
    assert json.loads(again.stdout)["unchanged"] == 4 and _chunk_count(tmp_path) == 20


# -- item 5: kill -9 between the reindex's renames -------------------------------------------------------
@pytest.mark.parametrize("with_tmp", [True, False], ids=["tmp-left", "tmp-gone"])
def test_collection_left_under_its_backup_name_is_restored_on_the_next_command(tmp_path, fake_embedder, with_tmp):
    env, folder = _ingested_store(tmp_path)
    _leave_reindex_between_renames(tmp_path, with_tmp=with_tmp)
    # The next command (a read) finds the collection whole, and nothing of the swap is left.
    listed = run_cli(tmp_path, "--json", "kb", "list-documents", "--collection", NAME, fake=True, env=env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert len(json.loads(listed.stdout)["documents"]) == 6
    assert _raw_names(tmp_path) == {NAME, "research-agent-meta"}
    assert _chunk_count(tmp_path) == 12
    again = run_cli(tmp_path, "--json", "kb", "add-folder", folder, "--collection", NAME, fake=True, env=env)
    assert json.loads(again.stdout)["unchanged"] == 6


def test_an_empty_collection_created_over_a_backup_never_costs_the_backup(tmp_path, fake_embedder):
    """The old advice (`collections create`) then `doctor --repair` deleted the only copy: the full one wins."""
    env, _ = _ingested_store(tmp_path)
    _leave_reindex_between_renames(tmp_path)
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:  # an empty live collection beside the backup, as the old advice produced
        with c.store.write_lock():
            c.store.client.create_collection(NAME, metadata={"hnsw:space": "cosine", "ra_schema_version": 1,
                                                             "embedding_model": FAKE_MODEL}, embedding_function=None)
    finally:
        c.close()
    repair = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
    assert repair.returncode == 0, repair.stdout + repair.stderr[-2000:]
    assert _chunk_count(tmp_path) == 12
    assert _raw_names(tmp_path) == {NAME, "research-agent-meta"}


def test_doctor_keeps_a_backup_holding_more_than_a_non_empty_live_collection(tmp_path, fake_embedder):
    env, _ = _ingested_store(tmp_path)
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:
        with c.store.write_lock():
            col = c.store.client.get_collection(NAME, embedding_function=None)
            backup = c.store.client.create_collection(f"research-agent-old-1234abcd-{NAME}",
                                                      metadata=dict(col.metadata), embedding_function=None)
            got = col.get(include=["embeddings", "documents", "metadatas"])
            backup.upsert(ids=got["ids"], embeddings=got["embeddings"], documents=got["documents"],
                          metadatas=got["metadatas"])
            col.delete(ids=got["ids"][:3])
    finally:
        c.close()
    repair = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
    report = json.loads(repair.stdout)
    assert f"research-agent-old-1234abcd-{NAME}" in _raw_names(tmp_path)
    assert report["leftovers"] == [f"research-agent-old-1234abcd-{NAME}"], report
    assert any(a.startswith("kept research-agent-old-1234abcd") and "doctor --repair" in a for a in report["actions"])
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:  # the live collection lost its incomplete documents (re-ingest them); the backup is whole
        assert c.store.client.get_collection(f"research-agent-old-1234abcd-{NAME}").count() == 12
        assert c.store.get_collection(NAME).count() < 12
    finally:
        c.close()


def test_not_found_guidance_never_advises_collections_create(tmp_path, fake_embedder):
    env = cli_env(tmp_path / "store", fake=True)
    out = run_cli(tmp_path, "--json", "kb", "list-documents", "--collection", "nosuch", fake=True, env=env)
    assert out.returncode == 4
    error = _error(out)
    assert "collections create" not in error["message"] + error["data"]["guidance"]
    assert "doctor --repair" in error["data"]["guidance"]


# -- item 6: kill -9 between deleting the collection and its records -----------------------------------------
def _leave_delete_half_done(tmp_path: Path) -> None:
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:
        with c.store.write_lock():
            c.store.delete_collection(NAME)  # the records (manifests, revision, links) survive the kill
    finally:
        c.close()


def test_recreated_collection_after_an_interrupted_delete_ingests_every_file(tmp_path, fake_embedder):
    env, folder = _ingested_store(tmp_path)
    _leave_delete_half_done(tmp_path)
    assert run_cli(tmp_path, "collections", "create", NAME, fake=True, env=env).returncode == 0
    out = run_cli(tmp_path, "--json", "kb", "add-folder", folder, "--collection", NAME, fake=True, env=env)
    report = json.loads(out.stdout)
    assert report["added"] == 6 and report["unchanged"] == 0 and report["chunks_written"] == 12
    query = run_cli(tmp_path, "--json", "query", "uniqdocsn3s1", "--collections", NAME, "--mode", "keyword",
                    "--no-rerank", fake=True, env=env)
    assert json.loads(query.stdout)["results"][0]["source_document"] == "docs/doc003.md"


def test_rerunning_an_interrupted_delete_finishes_it(tmp_path, fake_embedder):
    env, _ = _ingested_store(tmp_path)
    assert run_cli(tmp_path, "projects", "create", "proj", fake=True, env=env).returncode == 0
    assert run_cli(tmp_path, "projects", "link", "proj", "--collections", NAME, fake=True, env=env).returncode == 0
    _leave_delete_half_done(tmp_path)
    again = run_cli(tmp_path, "--json", "collections", "delete", NAME, "--yes", fake=True, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:
        assert c.store.registry_find("document", NAME) == {}
        assert NAME not in c.store.registry_get(["project:proj"])["project:proj"]["collections"]
    finally:
        c.close()
    gone = run_cli(tmp_path, "--json", "collections", "delete", NAME, "--yes", fake=True, env=env)
    assert gone.returncode == 4


# -- item 9: a reindex's temporary collection never reaches default-scope reads ------------------------------
def test_reindex_working_collections_stay_out_of_lists_and_default_scope_queries(tmp_path, fake_embedder):
    env, _ = _ingested_store(tmp_path)
    c = open_store(tmp_path / "store", embedding_model=FAKE_MODEL)
    try:  # a running (or killed) reindex: its temporary copy carries the collection's metadata
        with c.store.write_lock():
            col = c.store.client.get_collection(NAME, embedding_function=None)
            c.store.client.create_collection(f"research-agent-tmp-0badf00d-{NAME}", metadata=dict(col.metadata),
                                             embedding_function=None)
    finally:
        c.close()
    query = run_cli(tmp_path, "--json", "query", "uniqdocsn3s1", "--mode", "keyword", "--no-rerank", fake=True,
                    env=env)
    assert query.returncode == 0, query.stderr[-2000:]
    assert json.loads(query.stdout)["results"][0]["source_document"] == "docs/doc003.md"
    listed = run_cli(tmp_path, "--json", "collections", "list", fake=True, env=env)
    assert [x["name"] for x in json.loads(listed.stdout)["collections"]] == [NAME]


# -- item 14: the Chroma server down, or dying mid-run ---------------------------------------------------------
def _assert_retryable(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    error = _error(proc)
    assert error["code"] == -32001 and error["data"]["retryable"] is True, error
    assert "chroma run" in error["data"]["guidance"], error


@pytest.mark.slow
def test_chroma_server_down_or_dying_mid_run_is_retryable_exit_3(tmp_path, fake_embedder):
    port = free_port()
    env = cli_env(None, fake=True, RESEARCH_AGENT_CHROMA_HOST="127.0.0.1", RESEARCH_AGENT_CHROMA_PORT=str(port))
    server = start_chroma(tmp_path / "chroma", port)
    big = make_folder(tmp_path / "big", 600, sections=3, words=40, seed=5)
    try:
        assert run_cli(tmp_path, "collections", "create", NAME, fake=True, env=env).returncode == 0
        # Dying mid-run: the server is killed once the first batch is in.
        ingest = subprocess.Popen(
            cli_argv(tmp_path, "--json", "kb", "add-folder", big, "--collection", NAME, fake=True),
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        client = chromadb.HttpClient(host="127.0.0.1", port=port, settings=ChromaSettings(anonymized_telemetry=False))
        deadline = time.time() + 120
        while time.time() < deadline and client.get_collection(NAME).count() == 0:
            time.sleep(0.05)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        out, err = ingest.communicate(timeout=120)
        _assert_retryable(subprocess.CompletedProcess(ingest.args, ingest.returncode, out, err))
        # Down from the start: reads and writes alike.
        for args in (("kb", "add-folder", big, "--collection", NAME), ("collections", "info", NAME),
                     ("query", "alpha", "--collections", NAME, "--no-rerank"), ("kb", "reindex", "--collection", NAME)):
            _assert_retryable(run_cli(tmp_path, "--json", *args, fake=True, env=env))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
