"""Hostile folders: FIFOs, devices, symlink loops, non-UTF-8 names, unreadable folders, stale content, prune
safety and same-named folders; through the library, the real CLI (subprocess, --json) and the MCP tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections
from research_agent.errors import DocumentError
from research_agent.search import service as query

EXE = str(Path(sys.executable).parent / "research-agent")


# -- helpers -----------------------------------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def make_unreadable(monkeypatch, folder: Path) -> None:
    """Make `folder` unreadable: chmod 000, or, where that does not block reads (root), an os.scandir that
    refuses exactly that folder the way the kernel would."""
    folder.chmod(0)
    if not os.access(folder, os.R_OK):
        return
    real = os.scandir

    def scandir(path="."):
        if os.fsdecode(path).rstrip("/") == str(folder):
            raise PermissionError(13, "Permission denied", str(folder))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.fixture
def restore_modes():
    """Give chmod-ed folders their permissions back so tmp_path can be cleaned up."""
    folders: list[Path] = []
    yield folders
    for folder in folders:
        folder.chmod(0o755)


def hostile_folder(root: Path) -> Path:
    """good.md plus a FIFO, a symlink to /dev/zero, a symlink loop, a non-UTF-8 name and a folder loop."""
    write(root / "good.md", "# Good\n\nplainly readable aardvark text\n")
    write(root / "sub" / "nested.md", "# Nested\n\nnested zebra text\n")
    os.mkfifo(root / "pipe.md")
    os.symlink("/dev/zero", root / "zero.md")
    os.symlink("loop.md", root / "loop.md")                       # ELOOP
    os.symlink("..", root / "sub" / "up", target_is_directory=True)  # a folder loop
    with open(os.fsencode(root) + b"/bad\xff-name.md", "wb") as fh:
        fh.write(b"# Bad name\n\nlatin-1 file name\n")
    return root


def keyword_hits(c, word: str) -> list[str]:
    return [h.content for h in query.query_knowledge(c, word, mode="keyword", rerank=False).results]


def documents(c, collection: str) -> list[str]:
    return sorted(d.document for d in ingest.list_documents(c, collection).documents)


def cli(*args: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "--json", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


# -- reading only regular files, bounded ---------------------------------------------------------------------
def test_hostile_entries_are_per_file_problems_and_never_hang(container, fake_embedder):
    folder = hostile_folder(Path.cwd() / "hostile")
    collections.create_collection(container, "docs")
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=ingest.ingest_path(container, folder, "docs", recursive=True)),
                         daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "ingestion hung on a FIFO or device"
    report = result["r"]
    assert sorted(report.documents) == ["hostile/good.md", "hostile/sub/nested.md"]
    problems = {p.path: p.reason for p in [*report.skipped, *report.failed]}
    assert "FIFO" in problems["hostile/pipe.md"]
    assert "/dev/zero" in problems["hostile/zero.md"] or "device" in problems["hostile/zero.md"]
    assert "loop" in problems["hostile/loop.md"].lower()
    bad = [p for p in problems if p.startswith("hostile/bad")]
    assert len(bad) == 1 and "UTF-8" in problems[bad[0]]
    json.dumps(report.model_dump(mode="json"))  # the report itself must be encodable (no surrogates)


def test_size_limit_counts_bytes_read_not_stat_size(container, fake_embedder, monkeypatch):
    """/proc files report size 0 but have content: the limit must hold on the bytes actually read."""
    folder = Path.cwd() / "proc"
    write(folder / "small.md", "# S\n\nsmall\n")
    os.symlink("/proc/self/maps", folder / "maps.txt")  # regular file, st_size 0, kilobytes of text
    monkeypatch.setattr(container.settings, "max_file_mb", 200 / 2**20)  # 200 bytes
    collections.create_collection(container, "docs")
    report = ingest.ingest_path(container, folder, "docs", allowed_roots=[Path("/")])
    assert report.documents == ["proc/small.md"]
    assert [p.path for p in report.skipped] == ["proc/maps.txt"] and "limit" in report.skipped[0].reason


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_add_document_of_a_special_file_is_a_document_error(container, fake_embedder, special):
    collections.create_collection(container, "docs")
    if special == "fifo":
        special = str(Path.cwd() / "pipe.md")
        os.mkfifo(special)
    result: dict = {}

    def run() -> None:
        try:
            ingest.ingest_path(container, special, "docs")
        except DocumentError as exc:
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), f"add-document {special} hung"
    assert "regular file" in result["error"].message


@pytest.mark.slow
def test_cli_add_document_dev_zero_exits_5_quickly():
    assert cli("collections", "create", "docs").returncode == 0
    run = cli("kb", "add-document", "/dev/zero", "--collection", "docs", timeout=120)
    assert run.returncode == 5, run.stderr
    err = json.loads(run.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == -32003 and "regular file" in err["message"] and "Traceback" not in run.stderr


def test_any_failure_of_one_file_is_a_per_file_problem(container, fake_embedder, monkeypatch):
    """A parser blowing up (RecursionError from deep HTML, say) fails that file, not the folder."""
    from research_agent.ingest import chunking

    folder = Path.cwd() / "mixed"
    write(folder / "ok.md", "# Ok\n\nfine\n")
    write(folder / "deep.html", "<div>" * 10 + "deep" + "</div>" * 10)
    real = chunking.chunk_document

    def chunk_document(parsed, **kw):
        if kw.get("source", "").endswith("deep.html"):
            raise RecursionError("maximum recursion depth exceeded")
        return real(parsed, **kw)

    monkeypatch.setattr(chunking, "chunk_document", chunk_document)
    collections.create_collection(container, "docs")
    report = ingest.ingest_path(container, folder, "docs")
    assert report.documents == ["mixed/ok.md"]
    assert [p.path for p in report.failed] == ["mixed/deep.html"] and "RecursionError" in report.failed[0].reason


# -- unreadable folders ----------------------------------------------------------------------------------------
def test_unreadable_folder_is_reported_and_never_pruned(container, fake_embedder, monkeypatch, restore_modes):
    folder = Path.cwd() / "kb"
    write(folder / "top.md", "# Top\n\ntop text\n")
    write(folder / "locked" / "inner.md", "# Inner\n\ninner walrus text\n")
    collections.create_collection(container, "docs")
    first = ingest.ingest_path(container, folder, "docs", recursive=True)
    assert sorted(first.documents) == ["kb/locked/inner.md", "kb/top.md"]
    restore_modes.append(folder / "locked")
    make_unreadable(monkeypatch, folder / "locked")
    report = ingest.ingest_path(container, folder, "docs", recursive=True, prune=True)
    assert report.removed == 0
    assert any(p.path == "kb/locked" and "ermission" in p.reason for p in report.failed), report
    assert [p.path for p in report.not_pruned] == ["kb/locked/inner.md"]
    assert "kb/locked" in report.not_pruned[0].reason
    assert documents(container, "docs") == ["kb/locked/inner.md", "kb/top.md"]
    assert keyword_hits(container, "walrus")


# -- prune only what is really gone ------------------------------------------------------------------------------
def test_prune_keeps_files_outside_this_runs_selection(container, fake_embedder):
    folder = Path.cwd() / "kb"
    write(folder / "a.md", "# A\n\nalpha\n")
    write(folder / "b.txt", "beta text\n")
    write(folder / "skip.md", "# Skip\n\nskipped\n")
    write(folder / "sub" / "deep.md", "# Deep\n\ndeep text\n")
    write(folder / "gone.md", "# Gone\n\ngone text\n")
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, folder, "docs", recursive=True)
    (folder / "gone.md").unlink()
    report = ingest.ingest_path(container, folder, "docs", recursive=False, include=["*.md"], exclude=["skip*"],
                                prune=True)
    assert report.removed == 1 and report.removed_documents == ["kb/gone.md"]
    assert documents(container, "docs") == ["kb/a.md", "kb/b.txt", "kb/skip.md", "kb/sub/deep.md"]
    kept = {p.path: p.reason for p in report.not_pruned}
    assert set(kept) == {"kb/b.txt", "kb/skip.md", "kb/sub/deep.md"}
    assert "not selected" in kept["kb/sub/deep.md"]


def test_prune_keeps_a_file_that_exists_but_was_not_seen(container, fake_embedder, monkeypatch):
    """A file that the walk missed (here: the walk is made to miss it) but lstat still finds is kept."""
    from research_agent.ingest import folder as walk

    folder = Path.cwd() / "kb"
    write(folder / "a.md", "# A\n\nalpha\n")
    write(folder / "b.md", "# B\n\nbeta\n")
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, folder, "docs")
    real = walk.walk_folder

    def missing_b(*args, **kwargs):
        result = real(*args, **kwargs)
        result.files = [f for f in result.files if f.name != "b.md"]
        return result

    monkeypatch.setattr(walk, "walk_folder", missing_b)
    report = ingest.ingest_path(container, folder, "docs", prune=True)
    assert report.removed == 0 and [p.path for p in report.not_pruned] == ["kb/b.md"]
    assert "still exists" in report.not_pruned[0].reason


# -- stale content -------------------------------------------------------------------------------------------
def test_a_file_that_turns_bad_loses_its_old_chunks(container, fake_embedder, monkeypatch):
    folder = Path.cwd() / "kb"
    write(folder / "empty.md", "# E\n\nemptyword text\n")
    write(folder / "big.md", "# B\n\nbigword text\n")
    write(folder / "latin.md", "# L\n\nlatinword text\n")
    write(folder / "front.md", "# F\n\nfrontword text\n")
    write(folder / "keep.md", "# K\n\nkeepword text\n")
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, folder, "docs")
    for word in ("emptyword", "bigword", "latinword", "frontword"):
        assert keyword_hits(container, word)
    write(folder / "empty.md", "")
    write(folder / "big.md", "# B\n\nbigword " + "x" * 400)
    (folder / "latin.md").write_bytes("# L\n\nlatinword caf\xe9\n".encode("latin-1"))
    # Broken front matter: the front matter is ignored with a warning, the new body replaces the old text.
    write(folder / "front.md", "---\ntitle: [unclosed\n---\n# F\n\nreplacement\n")
    monkeypatch.setattr(container.settings, "max_file_mb", 300 / 2**20)
    report = ingest.ingest_path(container, folder, "docs")
    assert set(documents(container, "docs")) == {"kb/keep.md", "kb/front.md"}
    for word in ("emptyword", "bigword", "latinword", "frontword"):
        assert not keyword_hits(container, word), word
    assert keyword_hits(container, "replacement")
    assert [(w.path, "Front matter" in w.reason) for w in report.warnings] == [("kb/front.md", True)]
    assert set(report.removed_documents) == {"kb/big.md", "kb/empty.md", "kb/latin.md"}
    reasons = {p.path: p.reason for p in report.skipped}
    assert set(reasons) == set(report.removed_documents)
    assert all("removed from the index" in r for r in reasons.values())
    assert "UTF-8" in reasons["kb/latin.md"] and "limit" in reasons["kb/big.md"]


def test_add_document_of_a_file_turned_bad_removes_the_old_version(container, fake_embedder):
    path = write(Path.cwd() / "doc.md", "# D\n\ndocword text\n")
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, path, "docs")
    path.write_bytes(b"caf\xe9 not utf-8")
    with pytest.raises(DocumentError, match="removed"):
        ingest.ingest_path(container, path, "docs")
    assert documents(container, "docs") == [] and not keyword_hits(container, "docword")


def test_a_headings_only_file_is_indexed_not_dropped_real_model(container):
    """Heading text is content (attack 2, item 1): a file turned into an outline keeps a document whose
    headings a keyword and a semantic query find; only a truly empty file is "no text content"."""
    folder = Path.cwd() / "kb"
    path = write(folder / "release.md", "# Release checklist\n\nOld body about the zebrafish release.\n")
    write(folder / "empty.md", "# E\n\nemptyword text\n")
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, folder, "docs")
    write(path, "# Release checklist\n## Bump the version\n## Tag the release\n### Publish wheels to PyPI\n")
    write(folder / "empty.md", " \n\n")
    report = ingest.ingest_path(container, folder, "docs")
    assert report.updated == 1 and report.removed_documents == ["kb/empty.md"], report
    assert [p.path for p in report.skipped] == ["kb/empty.md"] and "no text content" in report.skipped[0].reason
    assert documents(container, "docs") == ["kb/release.md"]
    assert any("Publish wheels to PyPI" in t for t in keyword_hits(container, "publish wheels to PyPI"))
    assert not keyword_hits(container, "zebrafish")
    hits = query.query_knowledge(container, "how do I publish wheels", mode="semantic", rerank=False).results
    assert hits and hits[0].source_document == "kb/release.md"
    single = write(Path.cwd() / "outline.md", "# Plan\n## Phase one\n")
    assert ingest.ingest_path(container, single, "docs").added == 1  # add-document: no exit 5 either


# -- same-named folders ------------------------------------------------------------------------------------------
def test_same_named_folders_get_distinct_stable_keys(container, fake_embedder):
    a = write(Path.cwd() / "a" / "docs" / "x.md", "# X\n\nfrom folder a: anteater\n").parent
    b = write(Path.cwd() / "b" / "docs" / "x.md", "# X\n\nfrom folder b: bison\n").parent
    collections.create_collection(container, "docs")
    first = ingest.ingest_path(container, a, "docs", prune=True)
    assert first.documents == ["docs/x.md"]  # the key existing stores already have
    second = ingest.ingest_path(container, b, "docs", prune=True)
    assert second.added == 1 and second.documents == ["b/docs/x.md"]
    assert documents(container, "docs") == ["b/docs/x.md", "docs/x.md"]
    assert keyword_hits(container, "anteater") and keyword_hits(container, "bison")
    for folder in (a, b):  # re-ingesting maps to the same documents: nothing written, nothing pruned
        again = ingest.ingest_path(container, folder, "docs", prune=True)
        assert (again.unchanged, again.added, again.chunks_written, again.removed) == (1, 0, 0, 0)
    assert documents(container, "docs") == ["b/docs/x.md", "docs/x.md"]
    single = ingest.ingest_path(container, b / "x.md", "docs")  # the same file alone keeps its key
    assert single.unchanged == 1


# -- watch ----------------------------------------------------------------------------------------------------------
def test_watch_starts_and_keeps_going_on_a_hostile_folder(container, fake_embedder):
    from research_agent.ingest.watch import watch_folder

    folder = hostile_folder(Path.cwd() / "watched")
    collections.create_collection(container, "live")
    stop = threading.Event()
    reports: list = []
    errors: list = []

    def run() -> None:
        try:
            watch_folder(container, folder, "live", debounce=0.3, stop=stop, on_sync=reports.append)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline and not reports and not errors:
        time.sleep(0.1)
    assert not errors and reports, errors
    assert "watched/good.md" in reports[0].documents
    write(folder / "later.md", "# Later\n\nlater text\n")
    deadline = time.time() + 60
    while time.time() < deadline and "watched/later.md" not in documents(container, "live"):
        time.sleep(0.1)
    stop.set()
    t.join(timeout=15)
    assert "watched/later.md" in documents(container, "live") and not errors


# -- the real CLI and the MCP tool -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_add_folder_hostile_prune_json(tmp_path):
    folder = hostile_folder(Path.cwd() / "hostile")
    write(folder / "gone.md", "# Gone\n\ngone\n")
    assert cli("collections", "create", "docs").returncode == 0
    first = cli("kb", "add-folder", str(folder), "--collection", "docs")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert sorted(report["documents"]) == ["hostile/gone.md", "hostile/good.md", "hostile/sub/nested.md"]
    assert {"hostile/pipe.md", "hostile/zero.md", "hostile/loop.md"} <= {p["path"] for p in report["skipped"]}
    (folder / "gone.md").unlink()
    second = cli("kb", "add-folder", str(folder), "--collection", "docs", "--no-recursive", "--prune")
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout)
    assert report["removed_documents"] == ["hostile/gone.md"]
    assert [p["path"] for p in report["not_pruned"]] == ["hostile/sub/nested.md"]


@pytest.mark.slow
def test_cli_unreadable_folder_is_reported_not_pruned(tmp_path):
    folder = Path.cwd() / "kb"
    write(folder / "top.md", "# Top\n\ntop\n")
    write(folder / "locked" / "inner.md", "# Inner\n\ninner\n")
    assert cli("collections", "create", "docs").returncode == 0
    assert cli("kb", "add-folder", str(folder), "--collection", "docs").returncode == 0
    locked = folder / "locked"
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root: refuse that one folder in the CLI process itself
            code = ("import os, sys\nreal = os.scandir\n"
                    "def scandir(p='.'):\n"
                    f"    if os.fsdecode(p).rstrip('/') == {str(locked)!r}:\n"
                    f"        raise PermissionError(13, 'Permission denied', {str(locked)!r})\n"
                    "    return real(p)\n"
                    "os.scandir = scandir\n"
                    "from research_agent.cli.main import app\nsys.argv[0] = 'research-agent'\napp()\n")
            cmd = [sys.executable, "-c", code]
        else:
            cmd = [EXE]
        run = subprocess.run([*cmd, "--json", "kb", "add-folder", str(folder), "--collection", "docs", "--prune"],
                             capture_output=True, text=True, timeout=180)
    finally:
        locked.chmod(0o755)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["removed"] == 0 and [p["path"] for p in report["failed"]] == ["kb/locked"]
    assert [p["path"] for p in report["not_pruned"]] == ["kb/locked/inner.md"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_prune_never_removes_what_a_shallow_walk_did_not_see(fake_embedder, monkeypatch, anyio_backend):
    from fastmcp import Client

    import mcp_server

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    folder = hostile_folder(Path.cwd() / "kb")
    write(folder / "gone.md", "# Gone\n\ngone\n")

    async def call(client, **arguments):
        return (await client.call_tool("ingest_documents", arguments)).structured_content

    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kb1"})
        first = await call(client, path=str(folder), collection="kb1", recursive=True)
        assert "kb/sub/nested.md" in first["documents"]
        (folder / "gone.md").unlink()
        report = await call(client, path=str(folder), collection="kb1", prune=True, recursive=False)
    assert report["removed_documents"] == ["kb/gone.md"]
    assert [p["path"] for p in report["not_pruned"]] == ["kb/sub/nested.md"]
    assert "FIFO" in {p["path"]: p["reason"] for p in report["skipped"]}["kb/pipe.md"]


def test_a_model_that_cannot_load_stops_the_run_with_its_code_not_per_file(container, fake_embedder, monkeypatch):
    """Chunks are sized in the model's tokens, so each file asks for the model: its failure is the run's
    (ConfigError, exit 3), not N per-file "failed" lines with the store untouched and exit 0."""
    from research_agent import embeddings
    from research_agent.errors import ConfigError

    folder = Path.cwd() / "kb"
    write(folder / "a.md", "# A\n\nalpha text\n")
    write(folder / "b.md", "# B\n\nbeta text\n")
    collections.create_collection(container, "docs")

    def broken(settings):
        raise ConfigError("Model 'x' cannot load", guidance="Check RESEARCH_AGENT_EMBEDDING_MODEL.")

    monkeypatch.setattr(embeddings, "load_embedder", broken)
    with pytest.raises(ConfigError, match="cannot load"):
        ingest.ingest_path(container, folder, "docs")
    assert documents(container, "docs") == []
