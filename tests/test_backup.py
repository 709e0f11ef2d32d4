"""Backup and restore of a collection as JSONL (research_agent/ops/backup.py, issue 15): exact round trips with
notes and research, conflicts, truncated and hostile files, bounded reads, the CLI pipe and the MCP actions.
Real embedded Chroma throughout; the real packaged model where vectors matter (round trip, CLI pipe), the fake
embedder where only the write logic is under test."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from research_agent.catalog.collections import create_collection, get_collection_info
from research_agent.catalog.notes import add_note, add_research
from research_agent.catalog.projects import create_project, link_collections
from research_agent.container import build_container
from research_agent.errors import CollectionError, DocumentError
from research_agent.ingest.service import ingest_path
from research_agent.ops import backup
from research_agent.ops.backup import export_collection, import_collection
from research_agent.storage import chunks as chunk_pages

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    # ASCII JSON: a lone surrogate stays an escape, as a hostile file would carry it.
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="ascii")
    return path


def _without_stamps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The export without what an import cannot keep: when it was exported and when the collection was created."""
    head = {k: v for k, v in lines[0].items() if k != "exported_at"}
    head["collection"] = {k: v for k, v in head["collection"].items() if k != "created_at"}
    return [head, *lines[1:]]


def _files(folder: Path, count: int, sections: int = 2, tag: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    for i in range(count):
        body = "".join(f"## Part {j} of file {i}\n\nThe {tag} topic {i}-{j} covers retries, caches and queues "
                       f"in some detail for section {j}.\n\n" for j in range(sections))
        (folder / f"f{i:03d}.md").write_text(f"# File {i}\n\n{body}", encoding="utf-8")
    return folder


def _visible(c, collection: str) -> dict[str, int]:
    """{document: visible chunks} of a collection, and every manifest's chunks are all there."""
    col = c.store.get_collection(collection)
    counts: dict[str, int] = {}
    for _, _, meta, _ in chunk_pages.visible_chunks(c.store, collection, col):
        counts[meta["source_document"]] = counts.get(meta["source_document"], 0) + 1
    manifests = c.store.registry_find("document", collection)
    assert {m["document"]: m["chunk_count"] for m in manifests.values()} == counts
    return counts


# -- exactness, with the real model ----------------------------------------------------------------------------
@pytest.mark.slow
def test_round_trip_is_exact_with_notes_research_and_provenance(container, docs_folder, tmp_path):
    c = container
    create_collection(c, "kb1", type="fundamental", description="Team knowledge")
    create_project(c, "web")
    link_collections(c, "web", ["kb1"])
    ingest_path(c, docs_folder, "kb1", recursive=True)
    add_research(c, "kb1", "# Retry budget\n\nClients retry three times, then give up.",
                 source="https://example.org/retries", title="Retry budget")
    add_note(c, "kb1", "The cache TTL is five minutes, keyed by URL.", title="Cache TTL", source="standup 2026-11-20")

    first = tmp_path / "kb.jsonl"
    exported = export_collection(c, "kb1", first)
    lines = _lines(first)
    assert exported.documents == sum("document" in line for line in lines) >= 5 and not exported.skipped
    assert exported.bytes == first.stat().st_size and lines[-1] == {"end": {"documents": exported.documents,
                                                                            "chunks": exported.chunks}}
    kinds = {line["document"]["source"]: line["document"]["kind"] for line in lines if "document" in line}
    assert kinds["https://example.org/retries"] == "research" and kinds["standup 2026-11-20"] == "note"

    other = build_container(store=str(tmp_path / "restored"))
    try:
        create_project(other, "web")
        imported = import_collection(other, first)
        assert imported.created and not imported.with_embeddings and not imported.warnings
        assert (imported.added, imported.chunks, imported.documents) == (exported.documents, exported.chunks,
                                                                         exported.documents)
        info = get_collection_info(other, "kb1")
        assert (info.type, info.description, info.projects) == ("fundamental", "Team knowledge", ["web"])
        again = export_collection(other, "kb1", tmp_path / "again.jsonl")
        assert _without_stamps(_lines(tmp_path / "again.jsonl")) == _without_stamps(lines)
        assert again.bytes == exported.bytes  # same content, same timestamps' lengths

        from research_agent.search.service import query_knowledge

        top = query_knowledge(other, "how long is the cache TTL", collections=["kb1"], rerank=False).results[0]
        assert top.metadata["kind"] == "note" and "five minutes" in top.content
    finally:
        other.close()

    # With the vectors: an import on the same model writes them as they were, embedding nothing.
    export_collection(c, "kb1", tmp_path / "vectors.jsonl", with_embeddings=True)
    third = build_container(store=str(tmp_path / "third"))
    try:
        restored = import_collection(third, tmp_path / "vectors.jsonl")
        assert restored.with_embeddings and restored.chunks == exported.chunks
        ids = [cid for cid, *_ in chunk_pages.records(c.store.get_collection("kb1"), [])]
        want = c.store.get_collection("kb1").get(ids=ids, include=["embeddings"])
        got = third.store.get_collection("kb1").get(ids=ids, include=["embeddings"])
        stored = dict(zip(got["ids"], got["embeddings"]))
        # As written, to float32 rounding (Chroma may normalize cosine vectors again: 1 ulp on a few values).
        assert all(max(abs(a - b) for a, b in zip(vector, stored[cid])) < 1e-6
                   for cid, vector in zip(want["ids"], want["embeddings"]))
    finally:
        third.close()


# -- conflicts, truncation, hostile input (fake embedder: the write logic) ------------------------------------
def test_on_conflict_skip_replace_and_error(fake_embedder, container, tmp_path):
    c = container
    create_collection(c, "kb1")
    src = _files(Path.cwd() / "src", 3)
    ingest_path(c, src, "kb1")
    path = tmp_path / "kb.jsonl"
    export_collection(c, "kb1", path)
    exported = {line["document"]["document"]: line["document"]["content_hash"] for line in _lines(path)
                if "document" in line}
    (src / "f001.md").write_text("# File 1\n\nRewritten since the export.\n", encoding="utf-8")
    ingest_path(c, src, "kb1")
    changed = c.store.current_versions("kb1")["src/f001.md"]

    kept = import_collection(c, path)
    assert (kept.unchanged, kept.skipped, kept.replaced, kept.added, kept.chunks) == (2, 1, 0, 0, 0)
    assert kept.warnings == ["src/f001.md: other content already there, kept"]
    assert c.store.current_versions("kb1")["src/f001.md"] == changed

    with pytest.raises(DocumentError) as info:
        import_collection(c, path, on_conflict="error")
    second_document = [n for n, line in enumerate(_lines(path), 1) if "document" in line][1]
    assert info.value.data["line"] == second_document and "src/f001.md" in info.value.message
    assert c.store.current_versions("kb1")["src/f001.md"] == changed

    replaced = import_collection(c, path, on_conflict="replace")
    assert (replaced.replaced, replaced.unchanged) == (1, 2)
    assert c.store.current_versions("kb1") == exported
    _visible(c, "kb1")


def test_a_truncated_file_stops_at_its_line_keeps_whole_documents_and_a_rerun_finishes(fake_embedder, container,
                                                                                         tmp_path):
    c = container
    create_collection(c, "kb1")
    ingest_path(c, _files(Path.cwd() / "src", 5, sections=3), "kb1")
    full = tmp_path / "kb.jsonl"
    export_collection(c, "kb1", full)
    raw = full.read_bytes().splitlines(keepends=True)
    third = [n for n, line in enumerate(raw) if line.startswith(b'{"document"')][2]
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(raw[:third + 2]) + raw[third + 2][:25])  # inside the third document's 2nd chunk

    with pytest.raises(DocumentError) as info:
        import_collection(c, cut, collection="copy")
    assert info.value.data["line"] == third + 3 and "truncated" in info.value.message
    assert sorted(_visible(c, "copy")) == ["src/f000.md", "src/f001.md"]  # whole, and nothing of the third

    at_boundary = tmp_path / "boundary.jsonl"
    at_boundary.write_bytes(b"".join(raw[:-1]))  # every document, no end record
    with pytest.raises(DocumentError, match="end record"):
        import_collection(c, at_boundary, collection="copy")

    done = import_collection(c, full, collection="copy")
    assert (done.unchanged, done.added, done.created) == (5, 0, False)
    assert _visible(c, "copy") == _visible(c, "kb1")
    # Under another name the chunks are the copy's own: ids and the collection field derived for it.
    copy_ids = {cid for cid, in chunk_pages.records(c.store.get_collection("copy"), [])}
    assert not copy_ids & {cid for cid, in chunk_pages.records(c.store.get_collection("kb1"), [])}
    metas = [m for _, m in chunk_pages.records(c.store.get_collection("copy"), ["metadatas"])]
    assert {m["collection"] for m in metas} == {"copy"}


def test_a_line_claiming_a_gigabyte_is_refused_without_reading_it_whole(fake_embedder, container, tmp_path):
    c = container
    create_collection(c, "kb1")
    path = tmp_path / "kb.jsonl"
    export_collection(c, "kb1", path)
    header = path.read_bytes().splitlines(keepends=True)[0]
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:
        f.write(header + b'{"document": {"text": "')
        f.truncate(2**30)  # sparse: a 1 GB second line that costs no disk
    with open(huge, "rb") as stream:
        with pytest.raises(DocumentError) as info:
            import_collection(c, stream, collection="copy")
        assert stream.tell() <= len(header) + backup.MAX_LINE_BYTES + 1  # stopped after 8 MB of the 1 GB
    assert info.value.data["line"] == 2 and "longer than 8 MB" in info.value.message


def test_an_empty_collection_exports_and_imports(fake_embedder, container, tmp_path):
    create_collection(container, "empty", description="Nothing yet")
    path = tmp_path / "empty.jsonl"
    report = export_collection(container, "empty", path)
    lines = _lines(path)
    assert (report.documents, report.chunks, len(lines)) == (0, 0, 2) and lines[1] == {"end": {"documents": 0,
                                                                                              "chunks": 0}}
    imported = import_collection(container, path, collection="empty-copy")
    assert imported.created and imported.documents == 0
    assert get_collection_info(container, "empty-copy").description == "Nothing yet"


def test_overwriting_an_export_keeps_the_old_files_permissions(fake_embedder, container, tmp_path):
    # A 0600 backup replaced with --force must not come back world-readable (it holds every chunk's text).
    create_collection(container, "private", description="Secrets")
    path = tmp_path / "private.jsonl"
    path.write_text("old")
    path.chmod(0o600)
    export_collection(container, "private", path, overwrite=True)
    assert (path.stat().st_mode & 0o777, _lines(path)[0]["collection"]["name"]) == (0o600, "private")
    fresh = tmp_path / "fresh.jsonl"
    old_umask = os.umask(0o077)
    try:
        export_collection(container, "private", fresh)
    finally:
        os.umask(old_umask)
    assert fresh.stat().st_mode & 0o777 == 0o600  # a new file follows the user's umask


def test_a_full_output_stream_is_a_coded_error_naming_the_cause(fake_embedder, container):
    # `export kb -o - > /dev/full` said "Unexpected failure (OSError)".
    import errno
    import io

    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    create_collection(container, "full-disk", description="x")
    with pytest.raises(DocumentError, match="No space left on device") as info:
        export_collection(container, "full-disk", Full())
    assert "free space" in info.value.data["guidance"]


def _tamper(lines: list[dict[str, Any]], how: str) -> tuple[list[dict[str, Any]], int]:
    """A valid export changed one way; returns the lines and the line number the import must name."""
    lines = json.loads(json.dumps(lines))
    first_doc = next(n for n, line in enumerate(lines) if "document" in line)
    chunk = lines[first_doc + 1]["chunk"]
    if how == "format":
        lines[0]["format"] = "something-else"
        return lines, 1
    if how == "version":
        lines[0]["version"] = 99
        return lines, 1
    if how == "foreign id":  # a chunk claiming another document's id
        other = next(n for n, line in enumerate(lines) if "document" in line and n > first_doc)
        chunk["id"] = lines[other + 1]["chunk"]["id"]
        return lines, first_doc + 2
    if how == "other document":
        chunk["metadata"]["source_document"] = "elsewhere.md"
        return lines, first_doc + 2
    if how == "repeated document":
        size = lines[first_doc]["document"]["chunk_count"] + 1
        lines[first_doc + size:first_doc + size] = lines[first_doc:first_doc + size]
        return lines, first_doc + size + 1
    if how == "bad vector":
        chunk["embedding"] = [0.5, 0.5]
        return lines, first_doc + 2
    if how == "nested metadata":
        chunk["metadata"]["kind"] = {"nested": True}
        return lines, first_doc + 2
    if how == "lone surrogate":
        chunk["text"] = "\udcff"
        return lines, first_doc + 2
    if how == "empty hash":  # its chunk ids made to match: imported, the manifest was one no read can use
        from research_agent.storage.registry import chunk_ids

        doc = lines[first_doc]["document"]
        doc["content_hash"] = ""
        ids = chunk_ids(lines[0]["collection"]["name"], doc["document"], "", doc["chunk_count"])
        for offset, cid in enumerate(ids, start=1):
            lines[first_doc + offset]["chunk"]["id"] = cid
            lines[first_doc + offset]["chunk"]["metadata"]["content_hash"] = ""
        return lines, first_doc + 1
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["format", "version", "foreign id", "other document", "repeated document",
                                 "bad vector", "nested metadata", "lone surrogate", "empty hash"])
def test_hostile_files_are_refused_at_their_line(fake_embedder, container, tmp_path, how):
    c = container
    create_collection(c, "kb1")
    ingest_path(c, _files(Path.cwd() / "src", 2), "kb1")
    path = tmp_path / "kb.jsonl"
    export_collection(c, "kb1", path)
    bad, line = _tamper(_lines(path), how)
    with pytest.raises(DocumentError) as info:
        import_collection(c, _write(tmp_path / "bad.jsonl", bad), collection="copy")
    assert info.value.data["line"] == line, info.value.message
    assert info.value.data["guidance"]
    if c.store.has_collection("copy"):  # the header was fine: nothing of the bad document was written
        assert sorted(_visible(c, "copy")) == (["src/f000.md"] if how == "repeated document" else [])


def test_bad_names_and_options_are_refused_before_anything_is_written(fake_embedder, container, tmp_path):
    c = container
    create_collection(c, "kb1")
    path = tmp_path / "kb.jsonl"
    export_collection(c, "kb1", path)
    lines = _lines(path)
    lines[0]["collection"]["name"] = "no such/name"
    with pytest.raises(CollectionError):
        import_collection(c, _write(tmp_path / "bad.jsonl", lines))
    with pytest.raises(CollectionError):
        import_collection(c, path, collection="research-agent-meta")
    with pytest.raises(DocumentError, match="on_conflict"):
        import_collection(c, path, on_conflict="merge")  # type: ignore[arg-type]
    with pytest.raises(DocumentError, match="exists"):
        export_collection(c, "kb1", path)  # never over a file unasked
    assert export_collection(c, "kb1", path, overwrite=True).documents == 0
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(DocumentError, match="not a regular file"):
        import_collection(c, fifo)
    assert [col.name for col in c.store.list_collections()] == ["kb1"]


def test_export_reads_the_collection_in_pages(fake_embedder, container, tmp_path, monkeypatch):
    """Memory bounded by a page, not by the collection: every read asks for at most PAGE records."""
    c = container
    create_collection(c, "big")
    ingest_path(c, _files(Path.cwd() / "src", 40, sections=60), "big")
    total = sum(_visible(c, "big").values())
    assert total >= 2000
    monkeypatch.setattr(chunk_pages, "PAGE", 100)
    asked: list[int] = []
    real_open = backup.open_collection

    class Spy:
        def __init__(self, col):
            self.col, self.metadata, self.name = col, col.metadata, col.name

        def get(self, **kwargs):
            asked.append(len(kwargs["ids"]) if kwargs.get("ids") is not None else kwargs.get("limit") or 10**9)
            return self.col.get(**kwargs)

    monkeypatch.setattr(backup, "open_collection", lambda *a, **k: Spy(real_open(*a, **k)))
    report = export_collection(c, "big", tmp_path / "big.jsonl")
    assert report.chunks == total and max(asked) <= 100 and len(asked) >= total // 100


# -- the faces --------------------------------------------------------------------------------------------------
def _cli() -> list[str]:
    """The CLI as users run it; until research_agent/cli/main.py registers the commands, the same app with
    them mounted as main.py will (one `app.command` line each)."""
    from research_agent.cli.main import app

    if any(cmd.name == "export" for cmd in app.registered_commands):
        return [sys.executable, "-m", "research_agent"]
    mount = ("from research_agent.cli import backup; from research_agent.cli.main import app; "
             "app.command('export')(backup.export_command); app.command('import')(backup.import_command); "
             "app(prog_name='research-agent')")
    return [sys.executable, "-c", mount]


@pytest.mark.slow
def test_cli_export_piped_into_import_with_the_real_model(container, docs_folder, tmp_path):
    """`research-agent export kb1 | research-agent import - --collection copy` on one store: the export's
    read sessions never hold the import's commits back."""
    c = container
    create_collection(c, "kb1")
    ingest_path(c, docs_folder, "kb1", recursive=True)
    add_note(c, "kb1", "Deploys happen on Tuesdays.", title="Deploy day")
    want = _visible(c, "kb1")
    c.close()
    cli = shlex.join(_cli())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(f"{cli} export kb1 | {cli} --json import - --collection copy", shell=True, env=env,
                          capture_output=True, text=True, timeout=300, cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["collection"], summary["added"], summary["created"]) == ("copy", len(want), True)
    assert "Exported" in done.stderr  # the export's summary: stderr, since stdout carried the export
    after = build_container()
    try:
        assert _visible(after, "copy") == want
    finally:
        after.close()

    refused = subprocess.run([*_cli(), "--json", "import", str(tmp_path / "missing.jsonl")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 5 and json.loads(refused.stderr)["error"]["type"] == "DocumentError"


def test_records_and_web_pages_round_trip_and_a_failed_import_leaves_no_collection(container, fake_embedder,
                                                                                   tmp_path):
    """Outside tester (A4): a collection holding records (kind `record`) or web pages (kind `web`) exported to
    a file that import refused ("kind: Input should be 'document', 'research' or 'note'"), and each refused
    import left an empty collection behind."""
    from research_agent.ingest.parsing import parse_text
    from research_agent.ingest.prepare import PreparedDocument, chunk_parsed
    from research_agent.ingest.records import RecordFields, ingest_records
    from research_agent.ingest.service import write_documents

    c = container
    create_collection(c, "mixed")
    records = tmp_path / "tools.jsonl"
    records.write_text('{"id": "t1", "text": "Track a parcel by its number."}\n'
                       '{"id": "t2", "text": "Convert an address into coordinates."}\n', encoding="utf-8")
    ingest_records(c, records, "mixed", RecordFields(id="id", text=("text",)))
    page = "# Deploying\n\nBuild the image, push it, roll out."
    write_documents(c, "mixed", [PreparedDocument(
        document="url:http://127.0.0.1/deploy", title="Deploying", kind="web", source="http://127.0.0.1/deploy",
        content_hash="h1", chunks=chunk_parsed(c, parse_text(page, format="markdown", name="Deploying"),
                                                "url:http://127.0.0.1/deploy", "Deploying"))])
    exported = export_collection(c, "mixed", tmp_path / "mixed.jsonl")
    restored = import_collection(c, tmp_path / "mixed.jsonl", collection="mixed-copy")
    assert (restored.added, restored.chunks) == (exported.documents, exported.chunks) == (3, exported.chunks)
    kinds = sorted(line["document"]["kind"] for line in _lines(tmp_path / "mixed.jsonl") if "document" in line)
    assert kinds == ["record", "record", "web"]

    bad = _lines(tmp_path / "mixed.jsonl")
    bad[1]["document"]["kind"] = "nonsense"
    with pytest.raises(DocumentError, match="Line 2"):
        import_collection(c, _write(tmp_path / "bad.jsonl", bad), collection="never-made")
    assert not c.store.has_collection("never-made")


def test_forged_dimensions_deep_nesting_and_metadata_chroma_refuses_are_line_errors(container, fake_embedder,
                                                                                    tmp_path):
    """Outside tester (A2): a header claiming dimension 10 with 10-value vectors was imported and the
    collection could not be queried (InvalidArgumentError); 200k nested brackets and chunk metadata Chroma
    refuses (an empty or `$` key, a list mixing types) ended in "Unexpected failure" instead of a line error."""
    c = container
    create_collection(c, "src1")
    add_note(c, "src1", "The cache TTL is five minutes.", title="Cache TTL")
    export_collection(c, "src1", tmp_path / "v.jsonl", with_embeddings=True)
    forged = _lines(tmp_path / "v.jsonl")
    forged[0]["embedding"]["dimension"] = 10
    for line in forged:
        if "chunk" in line:
            line["chunk"]["embedding"] = line["chunk"]["embedding"][:10]
    report = import_collection(c, _write(tmp_path / "forged.jsonl", forged), collection="forged1")
    assert not report.with_embeddings  # re-embedded with the real model
    from research_agent.search.service import query_knowledge

    assert query_knowledge(c, "cache TTL", collections=["forged1"], rerank=False).results

    good = _lines(tmp_path / "v.jsonl")
    chunk_line = next(i for i, line in enumerate(good) if "chunk" in line)
    for bad_meta in ({"": 1}, {"$and": 1}, {"tags": ["a", 1]}):
        bad = [dict(line) for line in good]
        bad[chunk_line] = {"chunk": {**good[chunk_line]["chunk"], "metadata": {**good[chunk_line]["chunk"][
            "metadata"], **bad_meta}}}
        with pytest.raises(DocumentError, match=f"Line {chunk_line + 1}"):
            import_collection(c, _write(tmp_path / "meta.jsonl", bad), collection="meta1")
    nested = tmp_path / "nested.jsonl"
    nested.write_text(json.dumps(good[0]) + "\n" + "[" * 200_000 + "\n", encoding="utf-8")
    with pytest.raises(DocumentError, match="Line 2"):
        import_collection(c, nested, collection="nested1")
    assert not any(c.store.has_collection(n) for n in ("meta1", "nested1"))
