"""The keyword index's full build while documents are rewritten (finding 1 of the sixth attack pass).

End to end through a real `chroma run` server: another client rewrites documents between the pages of a
reader's first build (each rewrite deletes the document's old chunk, behind the scan). The old build skipped
chunks that existed for the whole build, yet gave their documents a state entry with their current hash, so
no later catch-up read them again: they were missing from keyword results for good. And defence in depth on
an embedded store: a build that misses chunks in its scan (whatever the cause) never records state for a
document whose chunks it did not all read.
"""

from __future__ import annotations

import threading

import pytest

from research_agent.catalog import collections
from research_agent.search import keyword_sync as sync, service as query
from research_agent.storage import chunks as chunk_pages
from test_keyword_window import _write_docs

DOCS = 40


def _word(j: int, version: int = 0) -> str:
    """A word only document `j` (at `version`) holds: letters only, so the analyzer keeps it whole."""
    return "zq" + "".join(chr(97 + int(d)) for d in f"{j:03d}{version:02d}") + "x"


def _write(c, collection: str, numbers, version: int = 0) -> None:
    """One write of one-chunk documents, document j holding _word(j, version)."""
    _write_docs(c, collection, numbers, body=lambda j: f"Fact {j}: {_word(j, version)} okapis and narwhals.")


def _hits(c, collection: str, text: str) -> list[str]:
    with c.store.session():
        res = query.query_knowledge(c, text, collections=[collection], mode="keyword", rerank=False)
    return [h.content for h in res.results]


def _missing(c, collection: str, versions: dict[int, int]) -> list[int]:
    return [j for j, v in versions.items() if not any(_word(j, v) in h for h in _hits(c, collection, _word(j, v)))]


def _between_pages(monkeypatch, name: str, step) -> dict[str, bool]:
    """After each page of this thread's where-scans of collection `name`, run `step` in another thread (joined):
    a writer on another machine, interleaved deterministically."""
    from chromadb.api.models.Collection import Collection

    real, reader, on = Collection.get, threading.current_thread(), {"on": True}

    def get(self, *args, **kwargs):
        res = real(self, *args, **kwargs)
        if on["on"] and threading.current_thread() is reader and self.name == name and kwargs.get("ids") is None:
            worker = threading.Thread(target=step)
            worker.start()
            worker.join(timeout=120)
        return res

    monkeypatch.setattr(Collection, "get", get)
    return on


def _two_machines(chroma_server):
    """A writer's and a reader's containers on the same `chroma run` (two machines sharing a store)."""
    from research_agent.container import build_container

    return tuple(build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
                 for _ in range(2))


def test_a_build_during_rewrites_through_a_server_misses_no_document(chroma_server, fake_embedder, monkeypatch):
    """40 documents; the reader's first build pages 4 chunks at a time, and after each page another client
    rewrites the next of the first documents (its old chunk, behind the scan, is deleted). After the writers
    stop, every document's current text is found by keyword (the old code lost about one per page)."""
    writer, reader = _two_machines(chroma_server)
    try:
        collections.create_collection(writer, "kw-paging")
        _write(writer, "kw-paging", range(DOCS))
        monkeypatch.setattr(chunk_pages, "PAGE", 4)
        versions = dict.fromkeys(range(DOCS), 0)
        rewrite = iter(range(DOCS))

        def step() -> None:
            j = next(rewrite, None)
            if j is not None:
                versions[j] = 1
                _write(writer, "kw-paging", [j], version=1)

        on = _between_pages(monkeypatch, "kw-paging", step)
        assert _hits(reader, "kw-paging", "okapis")  # the first build, interleaved with rewrites
        assert any(r.mode == "build" for r in sync.RECENT)
        on["on"] = False
        assert sum(versions.values()) >= 5  # the writer ran between pages
        assert _missing(reader, "kw-paging", versions) == []
    finally:
        writer.close()
        reader.close()


def _skipping_scan(monkeypatch, every: int) -> list[str]:
    """Make where-scans drop every `every`-th record (a scan that misses records, whatever the cause);
    returns the ids dropped. Reads by id are left whole."""
    real, dropped, seen = chunk_pages.pages, [], [0]

    def pages(col, include, *, where=None, ids=None):
        for res in real(col, include, where=where, ids=ids):
            if ids is None and col.name != "research-agent-meta":
                keep = []
                for i, rid in enumerate(res["ids"]):
                    seen[0] += 1
                    (dropped.append(rid) if seen[0] % every == 0 else keep.append(i))
                res = {f: ([res[f][i] for i in keep] if res.get(f) is not None else None) for f in ("ids", *include)}
            yield res

    monkeypatch.setattr(chunk_pages, "pages", pages)
    return dropped


def test_a_build_whose_scan_misses_chunks_fetches_them_by_id(container, fake_embedder, monkeypatch):
    """The build compares the chunks it read with each manifest's chunk_count and fetches the missing ones by
    their ids in the same commit: no document gets state without its chunks."""
    collections.create_collection(container, "docs")
    _write(container, "docs", range(DOCS))
    dropped = _skipping_scan(monkeypatch, every=7)
    assert _hits(container, "docs", "okapis")
    assert dropped and sync.RECENT[-1].mode == "build"
    assert sync.RECENT[-1].chunks == DOCS
    assert _missing(container, "docs", dict.fromkeys(range(DOCS), 0)) == []


def test_a_document_rewritten_during_the_build_is_not_left_with_state_and_no_chunks(container, fake_embedder,
                                                                                   monkeypatch):
    """A document whose chunks were neither in the scan nor found by id (rewritten after the build read its
    manifest: the old version's chunks are gone) is re-applied from its new manifest, so the index never holds
    the old hash with no chunks."""
    collections.create_collection(container, "docs")
    _write(container, "docs", range(DOCS))
    store, armed = container.store, [True]
    real = store.registry_find

    def find_then_rewrite(record, collection=None):
        found = real(record, collection)
        if armed[0] and record == "document":  # the build's read of every manifest: doc0005 changes right after
            armed[0] = False
            _write(container, "docs", [5], version=1)
        return found

    store.registry_find = find_then_rewrite
    try:
        index = sync.keyword_index(container, "docs", store.get_collection("docs"))
    finally:
        del store.registry_find
    assert not armed[0]
    built = [r for r in sync.RECENT if r.mode == "build"]
    if not built:
        pytest.fail("no build ran")
    held = index.versions_of(["doc0005"])
    current = container.store.current_versions("docs")["doc0005"]
    assert held == {"doc0005": current}
    assert [ch.id for ch, _ in index.search(_word(5, 1), 5)]


def test_a_build_whose_read_pages_were_all_rewritten_builds_again(chroma_server, fake_embedder, monkeypatch):
    """After the second page of the reader's build, another client rewrites the eight documents of the two
    pages it read in one write (their old chunks deleted at once): the scan cannot tell where it was, nothing
    is committed, and the build starts again; every document's current text is then found."""
    writer, reader = _two_machines(chroma_server)
    try:
        collections.create_collection(writer, "kw-rebuild")
        _write(writer, "kw-rebuild", range(DOCS))
        monkeypatch.setattr(chunk_pages, "PAGE", 4)
        pages = [0]

        def step() -> None:
            pages[0] += 1
            if pages[0] == 2:
                _write(writer, "kw-rebuild", range(8), version=1)

        real_build, started = sync._build, []

        def build(*args, **kwargs):
            started.append(pages[0])
            return real_build(*args, **kwargs)

        monkeypatch.setattr(sync, "_build", build)
        on = _between_pages(monkeypatch, "kw-rebuild", step)
        assert _hits(reader, "kw-rebuild", "okapis")
        on["on"] = False
        assert len(started) == 2, f"builds started after pages {started}"  # the first lost its place
        versions = {j: int(j < 8) for j in range(DOCS)}
        assert _missing(reader, "kw-rebuild", versions) == []
    finally:
        writer.close()
        reader.close()
