"""The library services on a real embedded Chroma: collections, projects, ingest, augment, query."""

from __future__ import annotations

import pytest

from research_agent import ingest
from research_agent.catalog import collections, notes as augment, projects
from research_agent.errors import CollectionError, ConfigError, DocumentError, QueryError
from research_agent.ops import status
from research_agent.search import service as query


def test_collection_lifecycle_and_errors(container, fake_embedder):
    info = collections.create_collection(container, "guides", type="fundamental", description="How-tos")
    assert (info.name, info.type, info.description, info.document_count) == ("guides", "fundamental", "How-tos", 0)
    with pytest.raises(CollectionError, match="already exists") as exc:
        collections.create_collection(container, "guides")
    assert exc.value.code == -32002 and exc.value.exit_code == 4 and exc.value.data["guidance"]
    for bad in ("a", "-bad-", "has space", "x" * 600, "research-agent-meta"):
        with pytest.raises(CollectionError):
            collections.create_collection(container, bad)
    with pytest.raises(CollectionError, match="Unknown collection type"):
        collections.create_collection(container, "other", type="weird")
    collections.create_collection(container, "notes")
    listed = collections.list_collections(container, type="fundamental").collections
    assert [c.name for c in listed] == ["guides"]
    assert collections.delete_collection(container, "guides").deleted == "guides"
    with pytest.raises(CollectionError, match="not found"):
        collections.get_collection_info(container, "guides")


def test_projects_link_defaults_and_query_scope(container, fake_embedder, docs_folder):
    collections.create_collection(container, "alpha")
    collections.create_collection(container, "beta")
    projects.create_project(container, "proj", description="demo")
    with pytest.raises(CollectionError, match="already exists"):
        projects.create_project(container, "proj")
    with pytest.raises(CollectionError, match="no default collections"):
        query.query_knowledge(container, "install", project="proj", rerank=False)
    info = projects.link_collections(container, "proj", ["alpha", "beta"])
    assert info.collections == ["alpha", "beta"]
    with pytest.raises(CollectionError, match="Unknown collections"):
        projects.link_collections(container, "proj", ["nope"])
    info = projects.set_default_collections(container, "proj", ["beta"])
    assert info.default_collections == ["beta"]
    assert collections.get_collection_info(container, "alpha").projects == ["proj"]
    ingest.ingest_path(container, docs_folder / "guide_install.md", "beta")
    ingest.ingest_path(container, docs_folder / "guide_api.md", "alpha")
    res = query.query_knowledge(container, "install linux", project="proj", rerank=False)
    assert res.collections == ["beta"]
    assert {h.metadata["collection"] for h in res.results} == {"beta"}
    info = projects.unlink_collections(container, "proj", ["beta"])
    assert info.collections == ["alpha"] and info.default_collections == []
    collections.delete_collection(container, "alpha")
    assert projects.get_project_info(container, "proj").collections == []
    projects.delete_project(container, "proj")
    assert projects.list_projects(container).projects == []


def test_ingest_is_incremental_and_replaces_changed_files(container, fake_embedder, docs_folder):
    collections.create_collection(container, "docs")
    first = ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    assert first.added == len(list(docs_folder.iterdir())) and first.updated == first.unchanged == 0
    total = collections.get_collection_info(container, "docs").chunk_count
    assert total == first.chunks_written > 0
    again = ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    assert (again.added, again.updated, again.unchanged, again.chunks_written) == (0, 0, first.added, 0)
    # Change one file: its old chunks are replaced, nothing else moves.
    target = docs_folder / "guide_install.md"
    target.write_text("# Install\n\nOnly one short paragraph about zebras now.\n")
    third = ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    assert (third.updated, third.unchanged, third.chunks_written) == (1, first.added - 1, 1)
    col = container.store.get_collection("docs")
    docs = ingest.list_documents(container, "docs").documents
    assert col.count() == sum(d.chunk_count for d in docs)
    hits = query.query_knowledge(container, "zebras", mode="keyword", rerank=False).results
    assert hits[0].source_document == "docs/guide_install.md" and "zebras" in hits[0].content
    assert not any("apt" in h.content for h in hits if h.source_document == "docs/guide_install.md")
    # Prune: a deleted file's chunks go.
    target.unlink()
    pruned = ingest.ingest_path(container, docs_folder, "docs", recursive=True, prune=True)
    assert pruned.removed == 1
    assert "docs/guide_install.md" not in [d.document for d in ingest.list_documents(container, "docs").documents]
    assert col.count() == sum(d.chunk_count for d in ingest.list_documents(container, "docs").documents)


def test_bad_input_is_coded_and_writes_nothing(container, fake_embedder, tmp_path):
    collections.create_collection(container, "docs")
    with pytest.raises(DocumentError, match="No such file"):
        ingest.ingest_path(container, "missing.md", "docs")
    binary = tmp_path / "work" / "blob.md"
    binary.write_bytes(b"\x00\x01\x02binary")
    with pytest.raises(DocumentError):
        ingest.ingest_path(container, binary, "docs")
    with pytest.raises(CollectionError):
        ingest.ingest_path(container, binary, "nope")
    with pytest.raises(DocumentError, match="outside the allowed roots"):
        ingest.ingest_path(container, "/etc/hostname", "docs", allowed_roots=[tmp_path / "work"])
    assert container.store.get_collection("docs").count() == 0
    assert ingest.list_documents(container, "docs").documents == []
    for bad in ("", "   ", "x" * 2001):
        with pytest.raises(QueryError):
            query.query_knowledge(container, bad, rerank=False)
    with pytest.raises(QueryError, match="Unknown mode"):
        query.query_knowledge(container, "x", mode="fuzzy")
    with pytest.raises(CollectionError, match="Unknown collections"):
        query.query_knowledge(container, "x", collections=["docs", "nope"])


def test_folder_skips_bad_files_with_reasons(container, fake_embedder, docs_folder):
    (docs_folder / "broken.md").write_bytes(b"\xff\xfe not utf8 \xff")
    (docs_folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (docs_folder / "node_modules").mkdir()
    (docs_folder / "node_modules" / "dep.md").write_text("# Dep\n\nvendored\n")
    collections.create_collection(container, "docs")
    report = ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    skipped = {s.path: s.reason for s in report.skipped}
    assert "docs/broken.md" in skipped and "docs/image.png" in skipped
    assert not any("node_modules" in d for d in report.documents)
    with pytest.raises(DocumentError, match="--strict") as exc:
        ingest.ingest_path(container, docs_folder, "docs", recursive=True, strict=True)
    assert exc.value.data["report"]["skipped"]


def test_augment_is_idempotent_and_searchable(container, fake_embedder):
    collections.create_collection(container, "research")
    text = "# Vector caches\n\nCaching embeddings by content hash makes re-ingest fifty times faster."
    first = augment.add_research(container, "research", text, "https://example.org/paper", title="Caches")
    assert (first.status, first.kind, first.title) == ("added", "research", "Caches")
    again = augment.add_research(container, "research", text, "https://example.org/paper", title="Caches")
    assert again.status == "unchanged" and again.document == first.document
    assert collections.get_collection_info(container, "research").document_count == 1
    hit = query.query_knowledge(container, "caching embeddings", rerank=False).results[0]
    assert hit.metadata["kind"] == "research" and hit.metadata["source"] == "https://example.org/paper"
    with pytest.raises(DocumentError):
        augment.add_research(container, "research", "  ", "src")


def test_query_result_shape_with_real_model(container, docs_folder):
    """The real packaged embedding model and a real Chroma; the default reranker is offline here."""
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    res = query.query_knowledge(container, "How do I install on Linux?", collections=["docs"], top_k=3)
    assert res.reranked is False and res.warnings and "Not reranked" in res.warnings[0]
    top = res.results[0]
    assert top.source_document == "docs/guide_install.md"
    assert "Linux" in top.header_path
    for field in ("document_title", "content_type", "chunk_sequence_id"):
        assert field in top.metadata
    assert top.metadata["content_type"] in ("prose", "code_block", "table")
    assert 0.0 <= top.relevance_score <= 1.0 and top.relevance_label
    assert res.query_refinement.status in ("optimal", "clarification_needed", "too_broad")
    report = status.get_status(container)
    assert report.embedding_loaded and report.reranker_available is False and report.reranker_error


def test_real_cross_encoder_reranks(container, docs_folder, tiny_cross_encoder, monkeypatch):
    monkeypatch.setattr(container.settings, "reranker_model", str(tiny_cross_encoder))
    monkeypatch.setattr(container.settings, "rerank_max_length", 256)
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    res = query.query_knowledge(container, "install on linux", top_k=5)
    assert res.reranked is True and not res.warnings
    scores = [h.relevance_score for h in res.results]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert all("rerank" in h.metadata["retrieval"] for h in res.results)
    assert container.reranker._model.max_length == 256
    assert status.get_status(container).reranker_precision in ("float32", "bfloat16")


def test_flagembedding_reranker_backend_loads_the_same_model(container, tiny_cross_encoder, monkeypatch):
    from research_agent.rerank import get_reranker

    monkeypatch.setattr(container.settings, "reranker_model", str(tiny_cross_encoder))
    monkeypatch.setattr(container.settings, "reranker_backend", "flagembedding")
    scores = get_reranker(container.settings).score("install linux", ["apt install on linux", "a poem"])
    assert scores is not None and len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    monkeypatch.setattr(container.settings, "reranker_backend", "sentence-transformers")
    st_scores = get_reranker(container.settings).score("install linux", ["apt install on linux", "a poem"])
    assert st_scores == pytest.approx(scores, abs=1e-4)


def test_unloadable_embedding_model_is_a_fast_config_error(container, monkeypatch):
    import time

    monkeypatch.setattr(container.settings, "embedding_model", "no-such-org/no-such-model")
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="no-such-org/no-such-model"):
        container.embedder
    assert time.perf_counter() - started < 20


def test_model_mismatch_asks_for_reindex(container, fake_embedder, docs_folder, monkeypatch):
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder / "guide_api.md", "docs")
    monkeypatch.setattr(container.settings, "embedding_model", "all-MiniLM-L6-v2")
    with pytest.raises(CollectionError, match="reindex"):
        query.query_knowledge(container, "api", collections=["docs"], rerank=False)
    report = ingest.reindex_collection(container, "docs")
    assert report.chunks_written > 0
    info = collections.get_collection_info(container, "docs")
    assert (info.embedding_model, info.embedding_dimension) == ("all-MiniLM-L6-v2", 384)
    assert query.query_knowledge(container, "api reference", collections=["docs"], rerank=False).results


def test_server_mode_with_real_chroma_run(chroma_server, monkeypatch, fake_embedder, docs_folder):
    from research_agent.container import build_container

    c = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    assert status.get_status(c).store_kind == "server"
    collections.create_collection(c, "remote-docs")
    projects.create_project(c, "remote-proj")
    projects.set_default_collections(c, "remote-proj", ["remote-docs"])
    report = ingest.ingest_path(c, docs_folder, "remote-docs", recursive=True)
    assert report.added > 0
    # A second client (another process would look the same to the server) sees projects and data.
    other = build_container(chroma_host=chroma_server["host"], chroma_port=chroma_server["port"])
    assert projects.get_project_info(other, "remote-proj").default_collections == ["remote-docs"]
    res = query.query_knowledge(other, "install linux", project="remote-proj", rerank=False)
    assert res.results and res.results[0].source_document.startswith("docs/")
    collections.delete_collection(c, "remote-docs")
    projects.delete_project(c, "remote-proj")


def test_unreachable_server_is_a_retryable_config_error(monkeypatch):
    from conftest import free_port
    from research_agent.container import build_container

    c = build_container(chroma_host="127.0.0.1", chroma_port=free_port())
    with pytest.raises(ConfigError) as exc:
        collections.list_collections(c)
    assert exc.value.data["retryable"] is True


def test_concurrent_first_calls_share_one_store(monkeypatch):
    """20 HTTP clients' first queries arrived together and each thread built its own Store, so two Chroma
    clients were created on one path at once ("Could not connect to tenant", KeyError in Chroma's system
    cache: -32000 for 2 of 20 clients in the HTTP load test)."""
    import threading
    import time

    from research_agent.container import build_container
    from research_agent.storage import store as store_module

    built = []
    real_init = store_module.Store.__init__

    def slow_init(self, settings):
        built.append(self)
        time.sleep(0.05)  # widen the window the way a loaded machine does
        real_init(self, settings)

    monkeypatch.setattr(store_module.Store, "__init__", slow_init)
    c = build_container()
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(c.store)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len({id(s) for s in seen}) == 1
