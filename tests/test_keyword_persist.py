"""The keyword index saved with the store: a new process opens it (no rebuild), a write is caught up per
document, and a damaged folder is removed and rebuilt rather than trusted."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent.catalog import collections, notes as augment
from research_agent.catalog.collections import open_collection
from research_agent.search import keyword_index as keyword, keyword_sync as sync, service as query

ANIMALS = [("Okapi", "Okapis live in the Ituri rainforest and eat leaves."),
           ("Narwhal", "Narwhals have one long tusk and live in arctic waters."),
           ("Pangolin", "Pangolins are covered in scales and eat ants in the rainforest."),
           ("Axolotl", "Axolotls regenerate their limbs in mexican lakes.")]


def ranked(c, text: str) -> list[tuple[str, float]]:
    res = query.query_knowledge(c, text, collections=["docs"], mode="keyword", rerank=False)
    return [(hit.content, hit.relevance_score) for hit in res.results]


def new_process(monkeypatch) -> None:
    """What a new process starts with: no index open."""
    monkeypatch.setattr(sync, "_open", {})


def index_dir(c) -> Path:
    return sync.index_path(keyword.persist_folder(c, open_collection(c, "docs")), keyword.field_weights(c.settings))


@pytest.fixture
def animals(container, fake_embedder):
    collections.create_collection(container, "docs")
    for title, text in ANIMALS:
        augment.add_research(container, "docs", text, f"src-{title}", title=title)
    return container


CHILD_QUERY = (
    "import json, sys; sys.path.insert(0, sys.argv[1])\n"
    "from conftest import FakeEmbedder, FAKE_EMBEDDER\n"
    "from research_agent import embeddings\n"
    "from research_agent.search import keyword_sync, service as query\n"
    "embeddings._cache[('sentence-transformers', FAKE_EMBEDDER, 'cpu')] = FakeEmbedder()\n"
    "def no_catch_up(*a, **k): raise AssertionError('caught up although the saved index is current')\n"
    "keyword_sync.catch_up = no_catch_up\n"
    "from research_agent.container import build_container\n"
    "c = build_container()\n"
    "with c.store.session():\n"
    "    res = query.query_knowledge(c, 'rainforest leaves', collections=['docs'], mode='keyword', rerank=False)\n"
    "print(json.dumps([[h.content, h.relevance_score] for h in res.results]))\n"
)


def test_a_new_process_loads_the_saved_index_instead_of_rebuilding(animals):
    import json

    before = ranked(animals, "rainforest leaves")
    assert before and (index_dir(animals) / "meta.json").is_file()
    env = dict(os.environ, RESEARCH_AGENT_EMBEDDING_MODEL="test-fake-embedder")
    out = subprocess.run([sys.executable, "-c", CHILD_QUERY, str(Path(__file__).parent)], env=env, timeout=120,
                         capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert [tuple(x) for x in json.loads(out.stdout.strip().splitlines()[-1])] == before


def test_a_write_is_caught_up_from_the_log_touching_only_its_document(animals, monkeypatch):
    assert not ranked(animals, "tardigrade")
    before = set(documents(animals))
    augment.add_research(animals, "docs", "Tardigrades survive in space.", "src-t", title="Tardigrade")
    (added,) = set(documents(animals)) - before
    new_process(monkeypatch)  # a new process too: the saved index is caught up, not rebuilt
    hits = ranked(animals, "tardigrade")
    assert hits and "Tardigrades" in hits[0][0]
    last = sync.RECENT[-1]
    assert (last.mode, last.documents, last.chunks) == ("log", [added], 1)


def documents(c) -> dict[str, str]:
    """{document: its manifest key} of the collection."""
    return {m["document"]: key for key, m in c.store.registry_find("document", "docs").items()}


def test_a_write_makes_the_saved_index_stale_and_only_the_newest_is_kept(animals, monkeypatch):
    """One index per collection, updated in place: writes leave no per-revision copies behind (the bm25s
    design saved one folder per revision)."""
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    assert ranked(animals, "okapi")
    for _ in range(2):
        _rewrite(animals, monkeypatch)
    assert sorted(p.name for p in folder.iterdir()) == [index_dir(animals).name, f"{index_dir(animals).name}.lock"]
    assert keyword.KeywordIndex.open(index_dir(animals), keyword.field_weights(animals.settings)).state.revision \
        == animals.store.revision("docs")


def test_a_revision_bump_the_log_does_not_name_falls_back_to_the_full_diff(animals):
    """`doctor --repair` and older writers bump without a change record: every manifest is compared instead."""
    assert ranked(animals, "okapi")
    col = open_collection(animals, "docs")
    okapi = next(d for d, key in documents(animals).items()
                 if "Okapi" in animals.store.registry_get([key])[key].get("title", ""))
    animals.store.registry_delete([documents(animals)[okapi]])  # a document removed behind the log's back
    animals.store.bump_revision("docs")
    assert not ranked(animals, "okapi")
    last = sync.RECENT[-1]
    assert (last.mode, last.documents, last.chunks) == ("diff", [okapi], 0)
    assert col.count() == 4  # its chunk is still in Chroma: the index followed the manifest, not the chunks


def _truncate(path: Path) -> None:
    target = max((f for f in path.iterdir() if f.is_file() and f.suffix in (".idx", ".term", ".store")),
                 key=lambda f: f.stat().st_size)
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])


def _garbage(path: Path) -> None:
    for f in path.iterdir():
        if f.is_file():
            f.write_bytes(b"garbage")


def _no_meta(path: Path) -> None:
    (path / "meta.json").unlink()


@pytest.mark.parametrize("damage", [_truncate, _garbage, _no_meta])
def test_a_damaged_saved_index_is_rebuilt_not_trusted(animals, monkeypatch, caplog, damage):
    before = ranked(animals, "okapis rainforest")
    damage(index_dir(animals))
    new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="research_agent.search.keyword_sync"):
        assert ranked(animals, "okapis rainforest") == before
    assert any("rebuilding" in r.getMessage() for r in caplog.records), caplog.text
    assert sync.RECENT[-1].mode == "build"
    reopened = keyword.KeywordIndex.open(index_dir(animals), keyword.field_weights(animals.settings))
    assert len(reopened) == len(ANIMALS)  # saved again, and whole


def test_an_unwritable_index_folder_only_costs_a_rebuild(animals, monkeypatch):
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    folder.parent.mkdir(parents=True)
    folder.write_text("not a folder")  # the index cannot be kept, as on a read-only store
    assert ranked(animals, "narwhal tusk")[0][0].startswith("Narwhals")
    new_process(monkeypatch)
    assert ranked(animals, "narwhal tusk")[0][0].startswith("Narwhals")


def test_server_mode_keeps_the_index_in_the_cache_folder_per_server(chroma_server, fake_embedder, tmp_path,
                                                                     monkeypatch):
    from research_agent.container import build_container

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    c = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    collections.create_collection(c, "kw-persist")
    try:
        augment.add_research(c, "kw-persist", "Axolotls regenerate their limbs.", "s1", title="Axolotl")
        want = query.query_knowledge(c, "axolotl", collections=["kw-persist"], mode="keyword", rerank=False)
        folder = keyword.persist_folder(c, open_collection(c, "kw-persist"))
        assert folder.is_relative_to(tmp_path / "cache" / "research-agent" / "keyword-index")
        assert (sync.index_path(folder, keyword.field_weights(c.settings)) / "meta.json").is_file()
        new_process(monkeypatch)
        monkeypatch.setattr(sync, "catch_up", lambda *a: pytest.fail("caught up although current"))
        got = query.query_knowledge(c, "axolotl", collections=["kw-persist"], mode="keyword", rerank=False)
        assert [h.content for h in got.results] == [h.content for h in want.results]
    finally:
        collections.delete_collection(c, "kw-persist")
        c.close()


def test_a_deleted_collections_index_is_removed_by_the_next_build(animals, fake_embedder):
    assert ranked(animals, "okapi")
    gone = keyword.persist_folder(animals, open_collection(animals, "docs"))
    collections.delete_collection(animals, "docs")
    collections.create_collection(animals, "docs")
    augment.add_research(animals, "docs", "Quokkas smile on Rottnest island.", "src-q", title="Quokka")
    assert ranked(animals, "quokka")
    assert not gone.exists() and index_dir(animals).is_dir()


def test_the_bm25s_indexes_it_replaced_are_removed_and_nothing_else(animals, monkeypatch):
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    old = [folder / "0f3a9c-w2.3-a1-bm25s0.3.16", folder / f".tmp-{'ab' * 16}"]
    for entry in old:
        (entry / "bm25").mkdir(parents=True)
        (entry / "bm25" / "data.csc.index.npy").write_bytes(b"x" * 1000)
    (folder / "notes").mkdir()
    (folder / "notes" / "keep.txt").write_text("mine")
    new_process(monkeypatch)
    assert ranked(animals, "okapi")
    assert not any(entry.exists() for entry in old)
    assert (folder / "notes" / "keep.txt").read_text() == "mine"


def _rewrite(c, monkeypatch) -> None:
    """A write, then a new process's query."""
    augment.add_research(c, "docs", "Quokkas smile on Rottnest island.", f"src-q{os.urandom(4).hex()}",
                         title="Quokka")
    new_process(monkeypatch)
    assert ranked(c, "quokka")


@pytest.mark.parametrize("linked", ["root", "collection"])
def test_pruning_never_deletes_what_is_not_ours_even_through_a_symlink(animals, monkeypatch, tmp_path, linked):
    """A user who moved the index folder to another disk (a symlink) loses nothing there: only entries
    with our own names are ever removed, and never by following a link (it deleted folders before)."""
    ranked(animals, "rainforest")
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    moved = folder.parent if linked == "root" else folder
    target = tmp_path / "elsewhere"
    os.rename(moved, target)
    (target / "important").mkdir()
    (target / "important" / "thesis.txt").write_text("precious")
    (target / "notes.txt").write_text("keep")
    os.symlink(target, moved)
    inner = tmp_path / "inner-target"
    inner.mkdir()
    (inner / "data.txt").write_text("keep too")
    os.symlink(inner, target / "a-link")
    os.symlink(inner, target / "0f3a9c-w2.3-a1-bm25s0.3.16")  # our old name, but a link: left alone
    for _ in range(2):
        _rewrite(animals, monkeypatch)
    assert (target / "important" / "thesis.txt").read_text() == "precious"
    assert (target / "notes.txt").read_text() == "keep" and (inner / "data.txt").read_text() == "keep too"


def _write_notes(c, collection: str, n: int) -> None:
    """`n` one-chunk documents in one write (benchmarks/scale.py's path)."""
    from test_keyword_window import _write_docs

    _write_docs(c, collection, range(n))


def _catch_up_bytes(c, collection: str, monkeypatch) -> int:
    """Bytes a one-document catch-up adds to or rewrites in the index folder (a new process's query)."""
    folder = sync.index_path(keyword.persist_folder(c, open_collection(c, collection)),
                             keyword.field_weights(c.settings))
    query.query_knowledge(c, "okapis", collections=[collection], mode="keyword", rerank=False)  # first build
    before = {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir()}
    augment.add_research(c, collection, "Tardigrades survive in space.", "src-probe", title="Probe")
    new_process(monkeypatch)
    hits = query.query_knowledge(c, "tardigrades", collections=[collection], mode="keyword", rerank=False)
    assert hits.results and hits.results[0].content.startswith("Tardigrades")
    assert (sync.RECENT[-1].mode, len(sync.RECENT[-1].documents)) == ("log", 1)
    return sum(f.stat().st_size for f in folder.iterdir()
               if before.get(f.name) != (f.stat().st_size, f.stat().st_mtime_ns))


def test_a_one_document_catch_up_writes_the_same_whatever_the_number_of_documents(container, fake_embedder,
                                                                                   monkeypatch):
    """Trigger: the state was one entry with every document's hash, rewritten by every commit (0.78 s of a
    0.99 s catch-up at 100k documents): the bytes a one-document catch-up wrote grew with the corpus."""
    written = {}
    for name, n in (("few", 3), ("many", 400)):
        collections.create_collection(container, name)
        _write_notes(container, name, n)
        written[name] = (_catch_up_bytes(container, name, monkeypatch), sync.RECENT[-1])
    (few, few_done), (many, many_done) = written["few"], written["many"]
    # The delete bitset of the built segment grows by 1 bit per document (400 docs: 50 bytes); the old
    # layout's state grew by ~100 bytes per document (40 KB here).
    assert abs(many - few) < 1024, (few, many)
    assert (many_done.entries, many_done.state_bytes) == (few_done.entries, few_done.state_bytes)
    assert many_done.entries == 2 and many_done.state_bytes < 400  # one chunk holding its state + the global


def _layout2(path: Path, texts: list[tuple[str, str]], revision: str) -> None:
    """A `tantivy-w2.3-a2` folder as this morning's code saved it: five fields, one `_state` entry holding
    every document's hash, claiming the current revision (so it would be trusted if it were opened)."""
    import json

    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("id", stored=True, tokenizer_name="raw")
    sb.add_text_field("doc", stored=False, tokenizer_name="raw")
    sb.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="freq")
    sb.add_bytes_field("text", stored=True)
    sb.add_bytes_field("meta", stored=True)
    path.mkdir(parents=True)
    index = tantivy.Index(sb.build(), path=str(path))
    writer = index.writer(15_000_000, 1)
    for doc, text in texts:
        writer.add_document(tantivy.Document(id=f"{doc}-0", doc=doc, body=text.lower(), text=text.encode(),
                                             meta=json.dumps({"source_document": doc}).encode()))
    state = {"versions": {doc: "0" * 64 for doc, _ in texts}, "revision": revision, "log_at": 1}
    writer.add_document(tantivy.Document(id="_state", doc="\x00state", meta=json.dumps(state).encode()))
    writer.commit()
    writer.wait_merging_threads()


def test_an_index_saved_in_the_previous_layout_is_replaced_by_a_build(animals, monkeypatch, caplog):
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    old = folder / "tantivy-w2.3-a2"
    _layout2(old, [(d, "Zebras graze on the savanna.") for d in documents(animals)], animals.store.revision("docs"))
    Path(f"{old}.lock").write_text("")
    new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="research_agent"):
        assert ranked(animals, "okapis rainforest")[0][0].startswith("Okapis")
        assert not ranked(animals, "zebras savanna")  # the old folder's (stale) text was never served
    assert sync.RECENT[-1].mode == "build"
    assert not [r for r in caplog.records if r.name.startswith("research_agent")], caplog.text  # not "damaged"
    assert not old.exists() and not Path(f"{old}.lock").exists()
    assert sorted(p.name for p in folder.iterdir()) == [index_dir(animals).name, f"{index_dir(animals).name}.lock"]
    assert len(keyword.KeywordIndex.open(index_dir(animals), keyword.field_weights(animals.settings))) == len(ANIMALS)


def test_an_index_folder_of_another_collection_is_never_served(animals, monkeypatch, caplog):
    """Trigger (outside tester): the collection's index folder symlinked to another collection's index served
    that collection's chunks as ghosts. The index keeps its Chroma collection id and one of another id is not
    used (nor rebuilt in place: that would wreck the other collection's)."""
    import shutil

    collections.create_collection(animals, "other")
    augment.add_research(animals, "other", "Quokkas smile on Rottnest island.", "src-q", title="Quokka")

    def other(text: str) -> list[str]:
        return [h.content for h in query.query_knowledge(animals, text, collections=["other"], mode="keyword",
                                                         rerank=False).results]

    assert ranked(animals, "okapi") and other("quokka") and not other("okapi")
    mine = keyword.persist_folder(animals, open_collection(animals, "other"))
    shutil.rmtree(mine)
    mine.symlink_to(keyword.persist_folder(animals, open_collection(animals, "docs")), target_is_directory=True)
    new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="research_agent.search.keyword_sync"):
        assert not other("okapi") and other("quokka")
    assert "symbolic link" in caplog.text  # a link is never used (a copied folder: "belongs to collection")
    assert ranked(animals, "okapi")[0][0].startswith("Okapis")  # the other collection's index is intact


def _immutable(folder: Path, on: bool) -> bool:
    """`chattr -R +i` (what the tester used; unlike chmod it also stops root); False where it is unsupported."""
    out = subprocess.run(["chattr", "-R", "+i" if on else "-i", str(folder)], capture_output=True, timeout=30)
    return out.returncode == 0


def _failing_commit(monkeypatch) -> None:
    """The tester's exact error (chmod as a non-root user): tantivy's commit raises inside `apply`."""
    add = keyword.KeywordIndex._add_chunks

    def failing(self, *args):
        if self.path is not None:
            raise ValueError("A worker thread encountered an error")
        return add(self, *args)
    monkeypatch.setattr(keyword.KeywordIndex, "_add_chunks", failing)


# "folder": with its lock file (PermissionError); "index": tantivy's folder alone (ValueError from its writer lock)
@pytest.mark.parametrize("frozen", ["folder", "index", "commit"])
def test_a_saved_index_that_can_no_longer_be_written_falls_back_to_memory(animals, caplog, monkeypatch, frozen):
    """Trigger (outside tester): the index folder and its parent made read-only after the index was saved, then
    a write: the query failed with "Unexpected failure (ValueError)" (tantivy's "A worker thread encountered an
    error" from the commit); the in-memory fallback covered only a folder that did not exist yet."""
    assert ranked(animals, "okapi")
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    folder = folder if frozen == "folder" else index_dir(animals)
    if frozen == "commit":
        _failing_commit(monkeypatch)
    elif not _immutable(folder, True):
        pytest.skip("chattr +i is not supported on this file system")
    try:
        augment.add_research(animals, "docs", "Tardigrades survive in space.", "src-t", title="Tardigrade")
        with caplog.at_level(logging.WARNING, logger="research_agent.search.keyword_sync"):
            hits = ranked(animals, "tardigrade")
            assert ranked(animals, "okapi")[0][0].startswith("Okapis")
    finally:
        _immutable(folder, False)
    assert hits and hits[0][0].startswith("Tardigrades")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "in memory" in warnings[0], warnings


def test_a_new_index_folder_that_cannot_be_written_logs_only_the_memory_fallback(animals, caplog):
    """Trigger (outside tester): an unwritable new folder first logged "is unusable (...); rebuilding it", which
    was not true (nothing was rebuilt), then "using one in memory"."""
    folder = keyword.persist_folder(animals, open_collection(animals, "docs"))
    folder.mkdir(parents=True)
    if not _immutable(folder, True):
        pytest.skip("chattr +i is not supported on this file system")
    try:
        with caplog.at_level(logging.WARNING, logger="research_agent.search.keyword_sync"):
            hits = ranked(animals, "narwhal tusk")
    finally:
        _immutable(folder, False)
    assert hits[0][0].startswith("Narwhals")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "using one in memory" in warnings[0], warnings


def test_a_copied_index_folder_of_another_collection_is_never_served(animals, monkeypatch, caplog):
    """The same as a linked folder, by copy: the copy names another Chroma collection id, so it is not used."""
    import shutil

    collections.create_collection(animals, "other")
    augment.add_research(animals, "other", "Quokkas smile on Rottnest island.", "src-q", title="Quokka")
    assert ranked(animals, "okapi")
    assert query.query_knowledge(animals, "quokka", collections=["other"], mode="keyword", rerank=False).results
    mine = keyword.persist_folder(animals, open_collection(animals, "other"))
    shutil.rmtree(mine)
    shutil.copytree(keyword.persist_folder(animals, open_collection(animals, "docs")), mine)
    new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="research_agent.search.keyword_sync"):
        found = query.query_knowledge(animals, "okapi", collections=["other"], mode="keyword", rerank=False)
    assert not found.results and "belongs to collection" in caplog.text
