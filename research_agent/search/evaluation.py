"""Retrieval evaluation on BEIR-format judgments: nDCG@k, Recall@k and MRR@k per query mode.

Files (the BEIR layout):
- queries.jsonl: one JSON object per line with `_id` and `text`;
- qrels .tsv: `query-id<TAB>corpus-id<TAB>score` with a header line; score > 0 means relevant
  (graded scores are used as gains in nDCG);
- corpus.jsonl (for `ingest_beir_corpus`): `_id`, `title`, `text`.

A hit's document id is the ingested document key (`source_document`): a file's relative path for
`kb add-folder`, or the corpus `_id` for `ingest_beir_corpus`. Documents are ranked by their best
chunk (one slot per document), as BEIR ranks whole documents.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pydantic import BaseModel

from research_agent.errors import DocumentError, QueryError

if TYPE_CHECKING:
    from research_agent.container import Container

EVAL_MODES = ("semantic", "keyword", "hybrid", "hybrid+rerank")


class ModeScores(BaseModel):
    mode: str
    available: bool = True
    reason: str | None = None          # why a mode is unavailable (e.g. the reranker cannot load)
    ndcg: float | None = None          # nDCG@k
    recall: float | None = None        # Recall@k
    mrr: float | None = None           # MRR@k
    queries: int = 0
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None


class EvalReport(BaseModel):
    collection: str
    k: int
    queries_evaluated: int
    queries_skipped: int                # judged queries whose text is missing from the queries file
    modes: list[ModeScores]


class BeirIngestProgress(BaseModel):
    documents_done: int
    documents_total: int


# -- files ------------------------------------------------------------------------------------
def read_queries(path: str | Path) -> dict[str, str]:
    """`_id` -> `text` from a BEIR queries.jsonl."""
    path = Path(path)
    if not path.is_file():
        raise DocumentError(f"Queries file not found: {path}", guidance="Pass a BEIR queries.jsonl (`_id`, `text`).")
    out: dict[str, str] = {}
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                out[str(obj["_id"])] = str(obj["text"])
            except (ValueError, KeyError, TypeError):
                raise DocumentError(f"{path}:{n} is not a JSON object with `_id` and `text`",
                                    guidance="Each line of queries.jsonl must be "
                                             "{\"_id\": ..., \"text\": ...}.") from None
    return out


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """query-id -> {corpus-id: score} from a BEIR qrels .tsv (the header line is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise DocumentError(f"Qrels file not found: {path}",
                            guidance="Pass a BEIR qrels .tsv (query-id, corpus-id, score).")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as fh:
        for n, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 3:
                raise DocumentError(f"{path}:{n} needs three tab-separated columns",
                                    guidance="Use the BEIR layout: query-id<TAB>corpus-id<TAB>score, "
                                             "with a header line.")
            try:
                score = int(float(row[2]))
            except ValueError:
                if n == 1:  # the header line
                    continue
                raise DocumentError(f"{path}:{n}: score {row[2]!r} is not a number",
                                    guidance="The third column is the relevance score (0, 1, 2 ...).") from None
            qrels.setdefault(row[0].strip(), {})[row[1].strip()] = score
    return qrels


# -- metrics ------------------------------------------------------------------------------------
def ndcg_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    """nDCG with linear gains (trec_eval / BEIR): sum rel_i / log2(i + 1) over the ideal ordering."""
    dcg = sum(judged.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    relevant = {d for d, g in judged.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def mrr_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    for i, doc in enumerate(ranked[:k], start=1):
        if judged.get(doc, 0) > 0:
            return 1.0 / i
    return 0.0


def _percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# -- ingest a BEIR corpus ------------------------------------------------------------------------
def iter_beir_corpus(path: str | Path, limit: int | None = None) -> Iterable[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise DocumentError(f"Corpus file not found: {path}",
                            guidance="Pass a BEIR corpus.jsonl (`_id`, `title`, `text`).")
    with path.open(encoding="utf-8") as fh:
        n = 0
        for line in fh:
            if not line.strip():
                continue
            if limit is not None and n >= limit:
                return
            n += 1
            yield json.loads(line)


def ingest_beir_corpus(c: Container, collection: str, corpus_jsonl: str | Path, limit: int | None = None,
                       progress: Callable[[BeirIngestProgress], None] | None = None, batch: int = 256,
                       suffix: str | None = None) -> int:
    """Write each corpus entry as a document whose key is its `_id` (title as document title, text chunked).

    `suffix` (e.g. ".py") parses each entry as a file with that extension would be parsed (CoSQA's functions
    are code, chunked by the code chunker, titled by the `_id` as a file by its stem); default plain text.
    Entries whose content is already stored are skipped, so a re-run resumes. Returns chunks written.
    """
    from research_agent.catalog.collections import open_collection
    from research_agent.embeddings import chunk_limits
    from research_agent.ingest import PreparedDocument, content_hash, write_documents
    from research_agent.ingest.chunking import chunk_document

    c.store.refresh()
    open_collection(c, collection)
    entries = list(iter_beir_corpus(corpus_jsonl, limit))
    existing = {m["document"]: m["content_hash"] for m in c.store.registry_find("document", collection).values()}
    written = 0
    pending: list[PreparedDocument] = []
    notify = progress or (lambda p: None)
    limits: dict[str, Any] | None = None
    for done, obj in enumerate(entries, start=1):
        doc_id, title, text = str(obj["_id"]), str(obj.get("title") or ""), str(obj.get("text") or "")
        digest = content_hash(f"{title}\n{text}")
        if existing.get(doc_id) != digest and (title.strip() or text.strip()):
            parsed = _parse_entry(text or title, title or doc_id, suffix)
            # Sized in the embedder's own tokens (loaded only once an entry needs writing).
            limits = limits or chunk_limits(c.embedder, c.settings.chunk_max_tokens)
            chunks = chunk_document(parsed, source=doc_id, title=title or doc_id, **limits)
            pending.append(PreparedDocument(document=doc_id, title=title or doc_id, kind="document", source=doc_id,
                                            content_hash=digest, chunks=chunks))
        if len(pending) >= batch or (done == len(entries) and pending):
            written += write_documents(c, collection, pending)
            pending = []
            notify(BeirIngestProgress(documents_done=done, documents_total=len(entries)))
    return written


def _parse_entry(text: str, title: str, suffix: str | None) -> Any:
    from research_agent.ingest.parsing import ParsedDocument, detect_format, parse_text

    fmt = detect_format(Path(f"x{suffix}")) if suffix else None
    if fmt is None:
        return ParsedDocument(text=text, format="text", title=title)
    parsed = parse_text(text, format=fmt, name=f"{title}{suffix}")
    parsed.title = parsed.title or title
    return parsed


# -- evaluate ------------------------------------------------------------------------------------
def _run_mode(c: Container, collection: str, mode: str) -> tuple[str, bool]:
    base, _, extra = mode.partition("+")
    if base not in ("semantic", "keyword", "hybrid") or extra not in ("", "rerank"):
        raise QueryError(f"Unknown evaluation mode {mode!r}", guidance=f"Use some of: {', '.join(EVAL_MODES)}.")
    return base, extra == "rerank"


def evaluate(c: Container, collection: str, queries_file: str | Path, qrels_file: str | Path, k: int = 10,
             modes: Iterable[str] = EVAL_MODES, *, limit: int | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> EvalReport:
    """nDCG@k, Recall@k and MRR@k of each mode over the judged queries (BEIR files).

    `limit` evaluates only the first N judged queries; `progress(mode, done, total)` is called per query.
    A `+rerank` mode whose reranker cannot load is reported unavailable, never scored unreranked.
    """
    from research_agent.search.service import query_knowledge, resolve_collections

    if not isinstance(k, int) or not 1 <= k <= c.settings.max_top_k:
        raise QueryError(f"k must be between 1 and {c.settings.max_top_k}", guidance="Pass a smaller --k.")
    c.store.refresh()
    resolve_collections(c, [collection], None)
    queries = read_queries(queries_file)
    qrels = read_qrels(qrels_file)
    judged = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    todo = [q for q in judged if q in queries]
    if limit is not None:
        todo = todo[:limit]
    if not todo:
        raise QueryError("No judged query has text in the queries file",
                         guidance="Check that the qrels query-ids match the `_id`s in queries.jsonl.")
    notify = progress or (lambda m, d, t: None)
    out: list[ModeScores] = []
    for mode in modes:
        base, rerank = _run_mode(c, collection, mode)
        if rerank and not c.reranker.load():
            out.append(ModeScores(mode=mode, available=False,
                                  reason=f"reranker {c.settings.reranker_model!r} is unavailable ({c.reranker.error})"))
            continue
        ndcg, recall, mrr, lat = [], [], [], []
        for done, qid in enumerate(todo, start=1):
            started = time.perf_counter()
            res = query_knowledge(c, queries[qid][: c.settings.max_query_chars], collections=[collection], top_k=k,
                                  mode=base, rerank=rerank, per_document_cap=1)
            lat.append((time.perf_counter() - started) * 1000)
            if rerank and not res.reranked:
                raise QueryError(f"The reranker failed during evaluation: {'; '.join(res.warnings)}")
            ranked = list(dict.fromkeys(h.source_document for h in res.results))
            ndcg.append(ndcg_at_k(ranked, qrels[qid], k))
            recall.append(recall_at_k(ranked, qrels[qid], k))
            mrr.append(mrr_at_k(ranked, qrels[qid], k))
            notify(mode, done, len(todo))
        out.append(ModeScores(mode=mode, ndcg=round(statistics.fmean(ndcg), 4),
                              recall=round(statistics.fmean(recall), 4), mrr=round(statistics.fmean(mrr), 4),
                              queries=len(todo),
                              latency_p50_ms=round(_percentile(lat, 50), 1),
                              latency_p95_ms=round(_percentile(lat, 95), 1)))
    return EvalReport(collection=collection, k=k, queries_evaluated=len(todo),
                      queries_skipped=len([q for q in judged if q not in queries]), modes=out)
