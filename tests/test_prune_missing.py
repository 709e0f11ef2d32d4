"""`kb prune` / manage_documents(action="prune") / ingest.prune_missing: documents whose recorded files are
really gone leave the index; everything that only looks gone (unreadable, an unmounted drive) stays, with a
reason. Through the library (real Chroma), the real CLI in a subprocess with the real model, and MCP."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections, notes as augment
from research_agent.errors import DocumentError
from research_agent.ingest import folder
from research_agent.search import service as query

EXE = str(Path(sys.executable).parent / "research-agent")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def documents(c, collection: str) -> list[str]:
    return sorted(d.document for d in ingest.list_documents(c, collection).documents)


def keyword_sources(c, word: str) -> list[str]:
    return sorted({h.source_document for h in query.query_knowledge(c, word, mode="keyword", rerank=False).results})


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "--json", *args], capture_output=True, text=True, timeout=timeout)


def project(root: Path) -> Path:
    """proj/docs with two files, plus a sibling so proj is not empty once docs moves away."""
    write(root / "docs" / "a.md", "# A\n\nthe aardvark manual page\n")
    write(root / "docs" / "sub" / "b.md", "# B\n\nthe bison manual page\n")
    write(root / "README.md", "# Readme\n\nproject readme\n")
    return root / "docs"


# -- the library ---------------------------------------------------------------------------------------------
def test_prune_missing_removes_gone_files_only_never_research_or_notes(container, fake_embedder):
    docs = project(Path.cwd() / "proj")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, docs, "kbase", recursive=True)
    ingest.ingest_path(container, docs.parent / "README.md", "kbase")
    research = augment.add_research(container, "kbase", "# Finding\n\nresearch aardvark\n", "https://example.org")
    note = augment.add_note(container, "kbase", "note aardvark", "A note")
    before = documents(container, "kbase")
    assert len(before) == 5 and {research.document, note.document} < set(before)
    (docs / "a.md").unlink()
    report = ingest.prune_missing(container, "kbase")
    assert report.removed == 1 and report.removed_documents == ["docs/a.md"] and report.not_pruned == []
    assert documents(container, "kbase") == [d for d in before if d != "docs/a.md"]
    assert "docs/a.md" not in keyword_sources(container, "aardvark")
    assert ingest.prune_missing(container, "kbase").removed == 0  # idempotent


def test_prune_missing_after_a_rename_removes_the_old_copy_and_keeps_the_new(container, fake_embedder):
    docs = project(Path.cwd() / "proj")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, docs, "kbase", recursive=True)
    docs.rename(docs.parent / "manual")
    ingest.ingest_path(container, docs.parent / "manual", "kbase", recursive=True, prune=True)
    assert len(documents(container, "kbase")) == 4  # the bug: both copies listed
    dry = ingest.prune_missing(container, "kbase", under=str(docs), dry_run=True)
    assert dry.dry_run and dry.removed == 0 and dry.removed_documents == ["docs/a.md", "docs/sub/b.md"]
    assert len(documents(container, "kbase")) == 4
    report = ingest.prune_missing(container, "kbase", under=str(docs))
    assert report.removed == 2 and report.removed_documents == ["docs/a.md", "docs/sub/b.md"]
    assert documents(container, "kbase") == ["manual/a.md", "manual/sub/b.md"]
    assert keyword_sources(container, "bison") == ["manual/sub/b.md"]


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO])
def test_prune_missing_never_removes_what_lstat_cannot_see(container, fake_embedder, monkeypatch, err):
    docs = project(Path.cwd() / "proj")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, docs, "kbase", recursive=True)
    real = os.lstat
    target = str(docs / "a.md")

    def lstat(path, *a, **kw):
        if os.fspath(path) == target:
            raise OSError(err, os.strerror(err), target)
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "lstat", lstat)
    report = ingest.prune_missing(container, "kbase", under=str(docs))
    assert report.removed == 0 and [p.path for p in report.not_pruned] == ["docs/a.md"]
    assert os.strerror(err) in report.not_pruned[0].reason
    assert len(documents(container, "kbase")) == 2


def test_prune_missing_never_removes_below_an_unreadable_folder(container, fake_embedder, monkeypatch):
    docs = project(Path.cwd() / "proj")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, docs, "kbase", recursive=True)
    (docs / "sub" / "b.md").unlink()
    real = os.scandir

    def scandir(path="."):
        if os.fsdecode(path).rstrip("/") == str(docs / "sub"):
            raise PermissionError(13, "Permission denied", str(docs / "sub"))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    report = ingest.prune_missing(container, "kbase", under=str(docs))
    assert report.removed == 0 and [p.path for p in report.not_pruned] == ["docs/sub/b.md"]
    assert "cannot be read" in report.not_pruned[0].reason


def test_an_emptied_mount_folder_looks_unmounted_and_needs_under(container, fake_embedder):
    """An unmounted drive leaves its (empty) mount folder: without --under nothing of it is pruned."""
    drive = Path.cwd() / "mnt" / "usb"
    write(drive / "notes" / "n.md", "# N\n\nnarwhal notes\n")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, drive / "notes", "kbase")
    shutil.rmtree(drive / "notes")  # what `umount` looks like from here: an empty mount folder
    report = ingest.prune_missing(container, "kbase")
    assert report.removed == 0 and [p.path for p in report.not_pruned] == ["notes/n.md"]
    assert "unmounted" in report.not_pruned[0].reason and "--under" in report.not_pruned[0].reason
    assert ingest.prune_missing(container, "kbase", under=str(drive)).removed_documents == ["notes/n.md"]


def test_a_missing_top_level_folder_is_refused_unless_confirmed():
    path = Path("/ra-test-no-such-drive-7f3e/docs/a.md")
    reason = folder.why_kept_missing(path, confirmed=False)
    assert reason and "unmounted" in reason
    assert folder.why_kept_missing(path, confirmed=True) is None
    assert folder.why_kept_missing(Path(__file__), confirmed=True) == folder.PRESENT


def test_prune_under_must_name_a_folder_inside_the_allowed_roots(container, fake_embedder, tmp_path):
    collections.create_collection(container, "kbase")
    with pytest.raises(DocumentError, match="allowed roots"):
        ingest.prune_missing(container, "kbase", under="/etc", allowed_roots=[tmp_path / "work"])
    with pytest.raises(DocumentError, match="top-level"):
        ingest.prune_missing(container, "kbase", under="/mnt")


def test_add_folder_prune_of_a_vanished_folder_points_at_kb_prune(container, fake_embedder):
    docs = project(Path.cwd() / "proj")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, docs, "kbase", recursive=True)
    docs.rename(docs.parent / "manual")
    with pytest.raises(DocumentError) as info:
        ingest.ingest_path(container, docs, "kbase", prune=True)
    assert f"kb prune --collection kbase --under {docs}" in info.value.data["guidance"]


def test_doctor_reports_documents_whose_files_are_gone_without_removing_them(container, fake_embedder):
    from research_agent.ops.doctor import run_doctor

    docs = project(Path.cwd() / "proj")
    collections.create_collection(container, "kbase")
    ingest.ingest_path(container, docs, "kbase", recursive=True)
    (docs / "a.md").unlink()
    for repair in (False, True):
        report = run_doctor(container, repair=repair)
        check = report.collections[0]
        assert check.missing_files == 1 and check.missing_examples == ["docs/a.md"], check
        assert any("research-agent kb prune --collection kbase" in a for a in report.advice)
    assert len(documents(container, "kbase")) == 2


# -- the real CLI with the real model ------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_prune_after_renaming_an_ingested_folder_real_model(tmp_path):
    docs = project(Path.cwd() / "proj")
    assert cli("collections", "create", "kbase").returncode == 0
    assert cli("kb", "add-folder", str(docs), "--collection", "kbase").returncode == 0
    docs.rename(docs.parent / "manual")
    assert cli("kb", "add-folder", str(docs.parent / "manual"), "--collection", "kbase", "--prune").returncode == 0
    old = cli("kb", "add-folder", str(docs), "--collection", "kbase", "--prune")
    assert old.returncode == 5 and f"kb prune --collection kbase --under {docs}" in old.stderr
    dry = cli("kb", "prune", "--collection", "kbase", "--under", str(docs), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["removed_documents"] == ["docs/a.md", "docs/sub/b.md"]
    run = cli("kb", "prune", "--collection", "kbase")  # the parent folder is still there: no --under needed
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["removed"] == 2 and report["removed_documents"] == ["docs/a.md", "docs/sub/b.md"]
    listed = json.loads(cli("kb", "list-documents", "--collection", "kbase").stdout)["documents"]
    assert sorted(d["document"] for d in listed) == ["manual/a.md", "manual/sub/b.md"]
    hits = json.loads(cli("query", "bison", "--collections", "kbase", "--mode", "keyword", "--no-rerank").stdout)
    assert {h["source_document"] for h in hits["results"]} == {"manual/sub/b.md"}


def test_cli_add_document_of_a_symlink_loop_names_the_loop(tmp_path):
    os.symlink("loop.md", Path.cwd() / "loop.md")
    run = cli("kb", "add-document", str(Path.cwd() / "loop.md"), "--collection", "kbase", timeout=120)
    assert run.returncode == 5
    assert "symlink loop" in json.loads(run.stderr.strip().splitlines()[-1])["error"]["message"]


# -- MCP -------------------------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_manage_documents_prune(fake_embedder, monkeypatch, anyio_backend):
    from fastmcp import Client

    import mcp_server

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    docs = project(Path.cwd() / "proj")
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        await client.call_tool("ingest_documents", {"path": str(docs), "collection": "kbase", "recursive": True})
        (docs / "a.md").unlink()
        dry = (await client.call_tool("manage_documents", {"action": "prune", "collection": "kbase",
                                                           "dry_run": True})).structured_content
        report = (await client.call_tool("manage_documents", {"action": "prune", "collection": "kbase",
                                                              "under": str(docs)})).structured_content
        listed = (
            await client.call_tool("manage_documents", {"action": "list", "collection": "kbase"})
        ).structured_content
    assert dry["removed"] == 0 and dry["removed_documents"] == ["docs/a.md"]
    assert report["removed"] == 1 and report["removed_documents"] == ["docs/a.md"]
    assert [d["document"] for d in listed["documents"]] == ["docs/sub/b.md"]
