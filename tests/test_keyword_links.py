"""The keyword index never deletes or writes through a symbolic link (the seventh session's last attack pass).

`<store>/keyword-index` linked to the store itself made one query delete the store's own HNSW segment folders
(their names look like collection ids, and the prune of deleted collections' indexes removed every such folder
not a live collection's): semantic search broke and doctor still said healthy. A linked collection folder made
readers delete old-layout names in, and write a whole index into, the link's target. A linked index folder over
a damaged target gave "Unexpected failure" on every query. Now a link anywhere in the index's own path means an
index in memory for this process (correct answers, one warning naming the link), and the prune removes only
folders holding our index files, never through a link."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.container import build_container
from research_agent.ingest import service as ingest
from research_agent.search import keyword_sync, service as query


def _store_with_docs(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"d{i}.md").write_text(f"# Doc {i}\n\nzebracorn{i} routers switch traffic after checks.\n")
    c = build_container()
    collections.create_collection(c, "kbase")
    ingest.ingest_path(c, docs, "kbase")
    return c


def _hits(c, text: str, mode: str) -> list[str]:
    keyword_sync.forget()
    found = query.query_knowledge(c, text, collections=["kbase"], mode=mode, rerank=False)
    return [Path(r.source_document).name for r in found.results]


def _segment_folders(store: Path) -> set[str]:
    return {p.name for p in store.iterdir() if p.is_dir() and keyword_sync._COLLECTION_ID.fullmatch(p.name)}


def test_a_keyword_index_folder_linked_to_the_store_deletes_nothing_of_it(tmp_path, fake_embedder):
    c = _store_with_docs(tmp_path)
    store = c.settings.store
    segments = _segment_folders(store)
    assert segments  # Chroma's own folders, named like collection ids
    assert _hits(c, "zebracorn0", "keyword")  # the index is built on disk, then replaced by a link
    shutil.rmtree(store / "keyword-index")
    (store / "keyword-index").symlink_to(".")

    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("research_agent.search.keyword_sync").addHandler(handler)
    try:
        assert _hits(c, "zebracorn1", "keyword")[:1] == ["d1.md"]  # still answered, from memory
    finally:
        logging.getLogger("research_agent.search.keyword_sync").removeHandler(handler)
    assert _segment_folders(store) == segments  # the old code deleted them here
    assert _hits(c, "zebracorn2 routers", "semantic")  # the vector index is intact
    assert any("symbolic link" in line for line in said), said


def test_a_linked_collection_folder_is_neither_written_nor_pruned_through(tmp_path, fake_embedder):
    c = _store_with_docs(tmp_path)
    assert _hits(c, "zebracorn0", "keyword")  # the index exists on disk
    root = c.settings.store / "keyword-index"
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    decoy = tmp_path / "decoy"
    (decoy / "tantivy-w2.3-a1").mkdir(parents=True)  # an old layout's name: removed when it is ours
    (decoy / "tantivy-w2.3-a1" / "precious").write_text("keep")
    (decoy / "keep.txt").write_text("keep")
    shutil.rmtree(folder)
    folder.symlink_to(decoy)

    assert _hits(c, "zebracorn0", "keyword")[:1] == ["d0.md"]
    assert sorted(os.listdir(decoy)) == ["keep.txt", "tantivy-w2.3-a1"]  # nothing written, nothing removed
    assert (decoy / "tantivy-w2.3-a1" / "precious").read_text() == "keep"


def test_a_linked_index_folder_over_a_damaged_target_still_answers(tmp_path, fake_embedder):
    c = _store_with_docs(tmp_path)
    assert _hits(c, "zebracorn0", "keyword")
    (folder,) = [p for p in (c.settings.store / "keyword-index").iterdir() if p.is_dir()]
    (index,) = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("tantivy-")]
    decoy = tmp_path / "damaged"
    decoy.mkdir()
    (decoy / "meta.json").write_text("garbage")
    shutil.rmtree(index)
    index.symlink_to(decoy)

    assert _hits(c, "zebracorn2", "keyword")[:1] == ["d2.md"]  # was "Unexpected failure (ValueError)"
    assert sorted(os.listdir(decoy)) == ["meta.json"]


def test_the_prune_removes_only_folders_holding_our_index(tmp_path, fake_embedder):
    c = _store_with_docs(tmp_path)
    assert _hits(c, "zebracorn0", "keyword")
    root = c.settings.store / "keyword-index"
    gone_ours = root / "00000000-0000-0000-0000-000000000001"
    (gone_ours / "tantivy-w2.3-a9").mkdir(parents=True)  # a deleted collection's index: pruned
    not_ours = root / "00000000-0000-0000-0000-000000000002"
    not_ours.mkdir()
    (not_ours / "data_level0.bin").write_text("someone else's")  # named like an id, not our files: kept
    ingest.ingest_path(c, tmp_path / "docs", "kbase")
    (tmp_path / "docs" / "d0.md").write_text("# Doc 0\n\nchanged zebracorn0 text\n")
    ingest.ingest_path(c, tmp_path / "docs", "kbase")
    keyword_sync.forget()
    shutil.rmtree(root / str(c.store.get_collection("kbase").id))  # the next query builds again, then prunes
    assert _hits(c, "zebracorn0", "keyword")
    assert not gone_ours.exists() and (not_ours / "data_level0.bin").exists()


@pytest.fixture(autouse=True)
def _fresh_indexes():
    keyword_sync.forget()
    yield
    keyword_sync.forget()
