"""Notes, document retrieval, watch mode and path safety of ingestion, on a real embedded Chroma."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections, notes as augment
from research_agent.errors import DocumentError
from research_agent.search import service as query


def test_notes_add_update_get(container, fake_embedder):
    collections.create_collection(container, "notes")
    note = augment.add_note(container, "notes", "# Plan\n\nUse sqlite for the cache.", "Cache plan")
    assert note.kind == "note" and note.status == "added" and note.document.startswith("note:")
    got = ingest.get_document(container, "notes", note.document)
    assert "sqlite" in got.content and got.title == "Cache plan"
    updated = augment.update_note(container, "notes", note.document, "# Plan\n\nUse redis for the cache.")
    assert updated.status == "updated" and updated.document == note.document
    got = ingest.get_document(container, "notes", note.document)
    assert "redis" in got.content and "sqlite" not in got.content
    assert collections.get_collection_info(container, "notes").document_count == 1
    hits = query.query_knowledge(container, "sqlite", mode="keyword", rerank=False).results
    assert not any("sqlite" in h.content for h in hits)
    with pytest.raises(DocumentError, match="not found"):
        augment.update_note(container, "notes", "note:missing", "x")


def test_get_document_by_path_reassembles_in_order(container, fake_embedder, docs_folder):
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder / "guide_install.md", "docs")
    got = ingest.get_document(container, "docs", str(docs_folder / "guide_install.md"))
    assert got.document == "docs/guide_install.md"
    text = got.content
    assert text.index("Prerequisites") < text.index("Linux")


def test_research_is_not_a_note(container, fake_embedder):
    collections.create_collection(container, "notes")
    r = augment.add_research(container, "notes", "# R\n\nfinding", "https://example.org")
    with pytest.raises(DocumentError, match="not a note"):
        augment.update_note(container, "notes", r.document, "changed")


def _watched_folder(container) -> Path:
    """A folder with one document and the collection `live` it is watched into."""
    folder = Path.cwd() / "watched"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nalpha content\n")
    collections.create_collection(container, "live")
    return folder


def test_watch_picks_up_create_modify_delete(container, fake_embedder, tmp_path):
    from research_agent.ingest.watch import watch_folder

    folder = _watched_folder(container)
    stop = threading.Event()
    reports = []
    t = threading.Thread(target=watch_folder, args=(container, folder, "live"),
                         kwargs={"debounce": 0.3, "stop": stop, "on_sync": reports.append}, daemon=True)
    t.start()

    def wait_for(pred, what):
        deadline = time.time() + 30
        while time.time() < deadline:
            if pred():
                return
            time.sleep(0.1)
        pytest.fail(f"watch did not pick up: {what}; reports={reports}")

    def docs():
        return {d.document: d for d in ingest.list_documents(container, "live").documents}

    wait_for(lambda: "watched/a.md" in docs(), "initial sync")
    (folder / "b.md").write_text("# B\n\nbeta content\n")
    wait_for(lambda: "watched/b.md" in docs(), "created file")
    old_hash = docs()["watched/a.md"].content_hash
    (folder / "a.md").write_text("# A\n\nalpha changed content\n")
    wait_for(lambda: docs()["watched/a.md"].content_hash != old_hash, "modified file")
    (folder / "b.md").unlink()
    wait_for(lambda: "watched/b.md" not in docs(), "deleted file")
    stop.set()
    t.join(timeout=10)
    assert not t.is_alive()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_watch_exits_cleanly_on_ctrl_c(tmp_path, signum):
    folder = Path.cwd() / "w"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nalpha\n")
    exe = str(Path(sys.executable).parent / "research-agent")
    subprocess.run([exe, "collections", "create", "live"], check=True, capture_output=True)
    proc = subprocess.Popen([exe, "--json", "kb", "watch", str(folder), "--collection", "live", "--debounce", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = json.loads(proc.stdout.readline())  # the initial sync's report
    assert first["added"] == 1
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "stopped watching" in err


def test_path_escapes_are_refused(container, fake_embedder, tmp_path):
    root = Path.cwd() / "allowed"
    root.mkdir()
    (root / "ok.md").write_text("# Ok\n\ninside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# Secret\n\ntop secret words\n")
    (root / "link.md").symlink_to(outside / "secret.md")
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    collections.create_collection(container, "docs")
    roots = [root.resolve()]
    for bad in ("../outside/secret.md", str(outside / "secret.md"), str(root / ".." / ".." / "outside"),
                str(root / "link.md"), "allowed/linkdir/secret.md", "allowed/\x00x"):
        with pytest.raises(DocumentError):
            ingest.ingest_path(container, bad, "docs", allowed_roots=roots)
    report = ingest.ingest_path(container, root, "docs", recursive=True, allowed_roots=roots)
    assert report.documents == ["allowed/ok.md"]
    assert not query.query_knowledge(container, "secret", mode="keyword", rerank=False).results


def test_limits_skip_files_with_reasons(container, fake_embedder, monkeypatch):
    folder = Path.cwd() / "big"
    folder.mkdir()
    (folder / "small.md").write_text("# S\n\nsmall\n")
    (folder / "large.md").write_text("# L\n\n" + "word " * 300_000)
    monkeypatch.setattr(container.settings, "max_file_mb", 1.0)
    collections.create_collection(container, "docs")
    report = ingest.ingest_path(container, folder, "docs")
    assert report.documents == ["big/small.md"]
    assert [s.path for s in report.skipped] == ["big/large.md"] and "limit" in report.skipped[0].reason.lower()
    monkeypatch.setattr(container.settings, "max_files_per_run", 1)
    with pytest.raises(DocumentError, match="exceed the limit"):
        ingest.ingest_path(container, folder, "docs")


def test_gitignore_and_globs(container, fake_embedder):
    folder = Path.cwd() / "repo"
    (folder / "docs").mkdir(parents=True)
    (folder / "build").mkdir()
    (folder / ".gitignore").write_text("secret*.md\n")
    (folder / "docs" / "a.md").write_text("# A\n\na\n")
    (folder / "docs" / "b.txt").write_text("b text\n")
    (folder / "secret-plan.md").write_text("# S\n\ns\n")
    (folder / "build" / "out.md").write_text("# O\n\no\n")
    collections.create_collection(container, "docs")
    report = ingest.ingest_path(container, folder, "docs", recursive=True)
    assert sorted(report.documents) == ["repo/docs/a.md", "repo/docs/b.txt"]
    collections.create_collection(container, "md-only")
    report = ingest.ingest_path(container, folder, "md-only", recursive=True, include=["*.md"], exclude=["docs/b*"])
    assert report.documents == ["repo/docs/a.md"]


def test_ci_job_command_line_against_chroma_server(chroma_server, tmp_path):
    """The exact commands of docs/examples/github-actions-ingest.yml, against a real `chroma run`."""

    yml = (Path(__file__).parents[1] / "docs" / "examples" / "github-actions-ingest.yml").read_text()
    step = yml.split("- name: Ingest docs/")[1].split("- uses:")[0]
    commands = [line.strip().rstrip("|").strip() for line in step.splitlines() if "research-agent" in line]
    assert any("kb add-folder docs --collection team-docs --prune --strict" in c for c in commands)
    env = {**os.environ, "RESEARCH_AGENT_CHROMA_HOST": chroma_server["host"],
           "RESEARCH_AGENT_CHROMA_PORT": str(chroma_server["port"]), "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RESEARCH_AGENT_STORE", None)
    shutil.copytree(Path(__file__).parent / "fixtures" / "docs", Path.cwd() / "docs")

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", "set -eo pipefail\n" + step.split("run: |")[1]],
                              env=env, capture_output=True, text=True, timeout=300)

    first = run()
    assert first.returncode == 0, first.stderr
    report = json.loads(Path("ingest-report.json").read_text())
    assert report["added"] == len(list((Path.cwd() / "docs").iterdir())) and not report["skipped"]
    again = run()
    assert again.returncode == 0, again.stderr
    assert json.loads(Path("ingest-report.json").read_text())["unchanged"] == report["added"]
    (Path.cwd() / "docs" / "blob.md").write_bytes(b"\x00\x01binary")
    (Path.cwd() / "docs" / "guide_api.md").unlink()
    strict = run()
    assert strict.returncode == 5
    err = json.loads(strict.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == -32003 and err["data"]["report"]["removed"] == 1
    assert err["data"]["report"]["skipped"][0]["path"] == "docs/blob.md"


def test_watch_sees_changes_made_during_the_initial_sync(container, fake_embedder):
    """The observer must be running before the first sync: a file written meanwhile was missed for good."""
    from research_agent.ingest.watch import watch_folder

    folder = _watched_folder(container)
    stop = threading.Event()
    reports = []

    def on_sync(report):
        if not reports:  # still inside the initial sync's call: a change arrives now
            (folder / "during.md").write_text("# During\n\nwritten during the first sync\n")
        reports.append(report)

    t = threading.Thread(target=watch_folder, args=(container, folder, "live"),
                         kwargs={"debounce": 0.3, "stop": stop, "on_sync": on_sync}, daemon=True)
    t.start()
    deadline = time.time() + 30
    names: set[str] = set()
    while time.time() < deadline and "watched/during.md" not in names:
        names = {d.document for d in ingest.list_documents(container, "live").documents}
        time.sleep(0.1)
    stop.set()
    t.join(timeout=10)
    assert "watched/during.md" in names, reports


def test_a_file_with_unparsable_front_matter_is_ingested_with_a_warning_in_the_report(container, fake_embedder,
                                                                                      tmp_path):
    # Issue 17: bad front matter dropped the whole file. Real files: a tab-indented mapping, an unclosed quote,
    # an impossible date (a ValueError from the YAML date constructor, which escaped the YAMLError handler).
    folder = tmp_path / "cards"
    folder.mkdir()
    (folder / "tab.md").write_text("---\ntitle: Tab\n\tauthor: someone\n---\n# Tab card\n\ntabword body\n")
    (folder / "quote.md").write_text('---\ntitle: "unclosed\n---\n# Quote card\n\nquoteword body\n')
    (folder / "date.md").write_text("---\ntitle: Date\ncreated: 2023-02-30\n---\n# Date card\n\ndateword body\n")
    collections.create_collection(container, "cards")
    report = ingest.ingest_path(container, folder, "cards")
    assert (report.added, report.skipped, report.failed) == (3, [], [])
    assert sorted(w.path for w in report.warnings) == ["cards/date.md", "cards/quote.md", "cards/tab.md"]
    assert all("Front matter" in w.reason and "ignored" in w.reason for w in report.warnings)
    assert "Front matter" in json.dumps(report.model_dump(mode="json"))  # what a --json user sees
    for word, document in (("tabword", "cards/tab.md"), ("quoteword", "cards/quote.md"), ("dateword", "cards/date.md")):
        hits = query.query_knowledge(container, word, collections=["cards"], mode="keyword").results
        assert [h.source_document for h in hits[:1]] == [document]


def test_stored_chunks_carry_the_line_range_of_the_file(container, fake_embedder, docs_folder):
    # Issue 17: a citation an agent can act on. guide_install.md opens with 7 lines of front matter.
    from research_agent.catalog.collections import open_collection
    from research_agent.storage.chunks import visible_chunks

    collections.create_collection(container, "docs")
    path = docs_folder / "guide_install.md"
    ingest.ingest_path(container, path, "docs")
    lines = path.read_text(encoding="utf-8").split("\n")
    stored = [(text, meta) for _, text, meta, _ in
              visible_chunks(container.store, "docs", open_collection(container, "docs"))]
    assert stored and all(isinstance(m["line_start"], int) and m["line_start"] <= m["line_end"] for _, m in stored)
    intro = next(m for text, m in stored if text.startswith("This guide covers"))
    assert (intro["line_start"], intro["line_end"]) == (9, 9) and lines[8].startswith("This guide covers")
    for text, meta in stored:  # each chunk's first and last line are in its range
        first, last = text.split("\n")[0].strip(), text.split("\n")[-1].strip()
        span = [s.strip() for s in lines[meta["line_start"] - 1:meta["line_end"]]]
        assert first in span and last in span, (text[:60], meta["line_start"], meta["line_end"])


def _sections_file(path: Path, sections: int) -> None:
    """A Markdown file of `sections` headed sections of ~60 distinct words each (about a chunk per section)."""
    path.write_text("\n\n".join(
        f"## Section {i} of {path.stem}\n\n" + " ".join(f"{path.stem}word{i}x{j}" for j in range(60)) + "."
        for i in range(sections)))


@pytest.mark.slow
def test_progress_moves_while_embedding_and_vectors_stay_those_of_the_chunks(container, tmp_path):
    """The bar sat still for the 75 s of embedding (issue 15: 30 files read in a second, then no event until the
    batch was written). Now a real ingest of ~100 chunks reports every embedding slice with a growing
    chunks_done, "writing" counts files whose chunks are committed, and reindex reports per slice too; the
    vectors written are still each chunk's own (slicing and its length order must not mix them up)."""
    from research_agent.catalog.collections import open_collection
    from research_agent.ingest.prepare import embedding_text
    from research_agent.ingest.service import EMBED_SLICE_CHUNKS

    folder = tmp_path / "sliced"
    folder.mkdir()
    _sections_file(folder / "big.md", 70)
    for name in ("a", "b", "c"):
        _sections_file(folder / f"{name}.md", 10)
    collections.create_collection(container, "sliced")
    events: list[ingest.IngestProgress] = []
    report = ingest.ingest_path(container, folder, "sliced", progress=events.append)
    assert report.added == 4 and report.chunks_written >= 90, report
    embedding = [e for e in events if e.stage == "embedding"]
    done = [e.chunks_done for e in embedding]
    assert len(embedding) >= 3 and done == sorted(done) and done[-1] == report.chunks_written, done
    assert max(b - a for a, b in zip(done, done[1:])) <= EMBED_SLICE_CHUNKS, done
    assert all(e.chunks_total == report.chunks_written and e.files_total == 4 for e in embedding)
    assert all(e.files_done == 0 for e in embedding)  # one batch: no file is committed until it is written
    progress = [e.files_progress for e in embedding]
    assert progress == sorted(progress) and 0 <= progress[0] < progress[-1] <= 4, progress
    last_embedding = events.index(embedding[-1])
    writing = [e for e in events[last_embedding:] if e.stage == "writing"]
    assert [e.files_done for e in writing] == [4] and events[-1].stage == "done"

    got = open_collection(container, "sliced").get(include=["embeddings", "documents", "metadatas"])
    expected = container.embedder.embed_documents(
        [embedding_text(m, t) for m, t in zip(got["metadatas"], got["documents"])])
    for stored, own in zip(got["embeddings"], expected):
        assert sum(a * b for a, b in zip(stored, own)) > 0.9999  # unit vectors: cosine 1 up to float noise

    events.clear()
    ingest.reindex_collection(container, "sliced", progress=events.append)
    done = [e.chunks_done for e in events if e.stage == "embedding"]
    assert len(done) >= 4 and done == sorted(done) and done[-1] == report.chunks_written, done
    assert max(b - a for a, b in zip(done, done[1:])) <= EMBED_SLICE_CHUNKS, done
