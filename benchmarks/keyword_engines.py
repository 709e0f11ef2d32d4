"""Keyword engines side by side (issue 16): ranking, costs and crash-safety fit of persisted keyword indexes.

Usage (engines other than bm25s are installed outside the project venv, e.g.
`.venv/bin/python -m pip install --target /tmp/kwengines tantivy==0.27.0`; SQLite FTS5 is in the stdlib):
  PYTHONPATH=/tmp/kwengines .venv/bin/python benchmarks/keyword_engines.py ranking [--sets scifact,nfcorpus] [--hybrid]
  PYTHONPATH=/tmp/kwengines .venv/bin/python benchmarks/keyword_engines.py costs --chunks 10000,100000 [--engines ...]
  PYTHONPATH=/tmp/kwengines .venv/bin/python benchmarks/keyword_engines.py crash --trials 20 --engines tantivy-rep-ours
  .venv/bin/python benchmarks/keyword_engines.py scale   (fits keyword_index.SCORE_SCALE on train queries)
  (--chunks-cache DIR keeps the chunks and vectors for repeat runs; figures: benchmarks/README.md,
  "Keyword engines for issue 16")

Engines (`engines()`): the shipped index (`shipped-tantivy`: research_agent.search.keyword_index, i.e.
tantivy-rep-ours with its state entry, scores x SCORE_SCALE; until issue 16 this slot held `today-bm25s`, the
bm25s index rebuilt per write, whose figures stay in benchmarks/README.md); bm25s alone with its save/load
(mmap); tantivy with three fields (keywords / title / content, boosts 3 / 2 / 1)
or one repeated field, on our analyzer's tokens (stems joined by spaces, `whitespace` tokenizer, so the
analyzers are identical) or on raw text with tantivy's `en_stem`; SQLite FTS5 with bm25(t, 3, 2, 1) or one
repeated column, pre-tokenized the same way. Every engine on our tokens is queried with the same terms
(KeywordIndex.query_terms: stems, typo corrections), so ranking differences are the engines' scoring alone.

Ranking: nDCG@10 on SciFact and NFCorpus test over the chunks of the stores benchmarks/beir_sets.py built
(benchmarks/.cache/<set>/<model>, read with the library), a document scored by its best chunk as `eval` does.
Costs: chunks are SciFact's, cycled with a numbered suffix as query_latency.py does; build, disk, open + first
query in a new process, warm query p50/p95 (100 SciFact test queries), add one document (10 chunks) + commit,
delete it + commit, and whether a reader in another process ever sees part of a document during the write.
Hybrid (`--hybrid`): the service's convex fusion (retrieve.fusion_scores, adaptive weight) over exact cosine on the
stored vectors and each engine's BM25, also with the engine's scores rescaled to bm25s's scale (fitted on train).
Crash: a writer process adding and deleting 10-chunk documents is killed with SIGKILL at a random moment; the
index must open, hold only whole documents, keep every acknowledged commit and accept a new writer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = ROOT.parent / "shared" / "data"
CACHE = ROOT / "benchmarks" / ".cache"
FIELDS = ("keywords", "title", "content")
#: ACDC boosts per field (keywords 3, title 2, content 1), the same numbers KeywordIndex repeats fields by.
BOOSTS = {"keywords": 3.0, "title": 2.0, "content": 1.0}
#: Chunks fetched per query before one slot per document (the pools of fusion_study.py keep 50).
DEPTH = 100
#: A token no corpus holds: the added document carries it in every chunk, so a reader counts its chunks.
MARK = "zqxkwmark"
#: Seconds a child process (open, concurrent reader) may take before it is killed.
CHILD_TIMEOUT = 300


def log(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


# -- data ---------------------------------------------------------------------------------------------
def load_chunks(name: str, cache_dir: Path | None) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, text, metadata) of every visible chunk of the set's benchmark store (read-only use of the library).

    `cache_dir` keeps a JSON copy, so repeated runs do not depend on the store code of the working tree."""
    cached = cache_dir / f"{name}.json" if cache_dir else None
    if cached and cached.is_file():
        return [tuple(r) for r in json.loads(cached.read_text())]
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.search.keyword_index import active_chunks

    c = build_container()
    model = c.settings.embedding_model.replace("/", "_")
    c = build_container(store=str(CACHE / name / model))
    rows = [(ch.id, ch.text, ch.metadata) for ch in active_chunks(c, name, open_collection(c, name))]
    if cached:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(rows))
    return rows


def judged_queries(name: str, limit: int | None = None,
                   split: str = "test") -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """A split's judged queries (cut to max_query_chars as `eval` does) and their qrels."""
    from beir_sets import split_files
    from research_agent.config import Settings
    from research_agent.search.evaluation import read_qrels, read_queries

    qpath, rpath = split_files(name, split, DATA)
    queries, qrels = read_queries(qpath), read_qrels(rpath)
    cut = Settings().max_query_chars
    todo = [q for q in qrels if q in queries and any(g > 0 for g in qrels[q].values())][:limit]
    return {q: queries[q][:cut] for q in todo}, {q: qrels[q] for q in todo}


class Analyzer:
    """Our keyword analyzer (research_agent.text) with a stem cache: the fields' token lists of a chunk."""

    def __init__(self) -> None:
        from research_agent.text import keyword_words, stemmer

        self.words, self.stemmer, self.cache = keyword_words, stemmer(), {}

    def stems(self, text: str) -> list[str]:
        words = self.words(text)
        todo = [w for w in set(words) if w not in self.cache]
        self.cache.update(zip(todo, self.stemmer.stemWords(todo)))
        return [self.cache[w] for w in words]

    def fields(self, meta: dict[str, Any], text: str) -> dict[str, str]:
        """Raw text per field, capped as KeywordIndex.index_text caps them."""
        from research_agent.ingest.chunking import TITLE_MAX_CHARS, cap_header_path, cap_list, cap_text

        title = f"{cap_text(str(meta.get('document_title') or ''), TITLE_MAX_CHARS)} " \
                f"{cap_header_path(str(meta.get('header_path') or ''))}".strip()
        kw = meta.get("keywords") or []
        keywords = " ".join(cap_list([str(k) for k in (kw if isinstance(kw, list) else [kw])]))
        return {"keywords": keywords, "title": title, "content": text}


def make_rows(chunks: list[tuple[str, str, dict[str, Any]]], an: Analyzer) -> list[dict[str, Any]]:
    """One row per chunk: id, document key, raw fields and stemmed fields."""
    rows = []
    for cid, text, meta in chunks:
        raw = an.fields(meta, text)
        rows.append({"id": cid, "doc": str(meta.get("source_document")), "raw": raw,
                     "stems": {f: an.stems(raw[f]) for f in FIELDS}, "text": text, "meta": meta})
    return rows


def rep_tokens(r: dict[str, Any]) -> list[str]:
    """The BM25F-by-repetition token list KeywordIndex indexes: content, title x2, keywords x3."""
    st = r["stems"]
    return st["content"] + st["title"] * 2 + st["keywords"] * 3


def cycled_rows(base: list[dict[str, Any]], n: int) -> Any:
    """n rows, lazily: the base rows repeated with a numbered suffix on id, document and title
    (query_latency.py's cycling); copies share the base rows' token lists, so 1M rows fit in memory."""
    for i in range(n):
        r = base[i % len(base)]
        rep = i // len(base)
        if rep:
            title = f"{r['raw']['title']} ({rep})"
            r = dict(r, id=f"{r['id']}#{rep}", doc=f"{r['doc']}#{rep}", raw=dict(r["raw"], title=title),
                     meta=dict(r["meta"], source_document=f"{r['doc']}#{rep}",
                               document_title=f"{r['meta'].get('document_title', '')} ({rep})"))
        yield r


def new_document(chunks: list[tuple[str, str, dict[str, Any]]], key: str) -> list[tuple[str, str, dict[str, Any]]]:
    """A new 10-chunk document (texts of existing chunks plus MARK), as one ingest of a file writes."""
    return [(f"{key}-{i}", f"{text} {MARK}", dict(meta, source_document=key, document_title=f"new {key}"))
            for i, (_, text, meta) in enumerate(chunks[:10])]


# -- engines ------------------------------------------------------------------------------------------
class Engine:
    """Build into a folder, open it, search with our query terms (or the query text), add and delete documents."""

    name = "base"
    native_query = False   # True: search gets the raw query text (the engine's own analyzer)

    def build(self, folder: Path, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def open(self, folder: Path) -> None:
        raise NotImplementedError

    def search(self, terms: list[str], k: int, query: str = "") -> list[tuple[str, float]]:
        raise NotImplementedError

    def add(self, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def delete(self, doc: str) -> None:
        raise NotImplementedError

    def count(self, term: str) -> int:
        """Chunks holding `term` in the latest committed state (a reader's refresh, then a search)."""
        raise NotImplementedError


class ShippedEngine(Engine):
    """The shipped index (research_agent.search.keyword_index, the tantivy-rep-ours design with its state entry
    and per-document commits); scores on bm25s's scale (x SCORE_SCALE). It replaced `today-bm25s` (the
    rebuilt-per-write bm25s index; its figures are in benchmarks/README.md, its code in git history)."""

    name = "shipped-tantivy"

    def build(self, folder: Path, rows: Any) -> None:
        from research_agent.search.keyword_index import IndexState, KeywordIndex

        self.index = KeywordIndex.open(folder, (2, 3))
        self.index.apply([], ((r["doc"], _chunk(r)) for r in rows), IndexState(revision="built"), replace_all=True)

    def open(self, folder: Path) -> None:
        from research_agent.search.keyword_index import KeywordIndex

        self.index = KeywordIndex.open(folder, (2, 3))

    def search(self, terms: list[str], k: int, query: str = "") -> list[tuple[str, float]]:
        return [(ch.id, score) for ch, score in self.index.search(query, k)]

    def add(self, rows: list[dict[str, Any]]) -> None:
        doc = rows[0]["doc"]
        self.index.apply([doc], [(doc, _chunk(r)) for r in rows], self.index.state)

    def delete(self, doc: str) -> None:
        self.index.apply([doc], [], self.index.state)

    def count(self, term: str) -> int:
        self.index.reload()
        return self.index._freq(term)


def _chunk(r: dict[str, Any]) -> Any:
    from research_agent.search.keyword_index import Chunk

    return Chunk(r["id"], r["text"], r["meta"])


class Bm25sEngine(Engine):
    """bm25s with its own save/load (memory-mapped arrays) and an id list beside it; a write re-indexes all."""

    name = "bm25s-mmap"

    def build(self, folder: Path, rows: list[dict[str, Any]]) -> None:
        import bm25s

        self.folder, self.rows = folder, list(rows)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        retriever = bm25s.BM25()
        retriever.index([rep_tokens(r) for r in self.rows], show_progress=False)
        retriever.save(str(tmp), show_progress=False)
        (tmp / "ids.json").write_text(json.dumps([r["id"] for r in self.rows]))
        shutil.rmtree(folder, ignore_errors=True)   # a real design renames a new revision folder into place
        os.rename(tmp, folder)

    def open(self, folder: Path) -> None:
        import bm25s

        self.folder = folder
        self.retriever = bm25s.BM25.load(str(folder), mmap=True)
        self.ids = json.loads((folder / "ids.json").read_text())

    def search(self, terms: list[str], k: int, query: str = "") -> list[tuple[str, float]]:
        import numpy as np

        known = [t for t in terms if t in self.retriever.vocab_dict]
        if not known:
            return []
        scores = self.retriever.get_scores(known)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(self.ids[i], float(scores[i])) for i in top if scores[i] > 0]

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.build(self.folder, self.rows + rows)
        self.open(self.folder)

    def delete(self, doc: str) -> None:
        self.build(self.folder, [r for r in self.rows if r["doc"] != doc])
        self.open(self.folder)


class TantivyEngine(Engine):
    """tantivy: segments + meta.json; a commit publishes every document added since the last one atomically."""

    def __init__(self, layout: str = "fields", tokens: str = "ours") -> None:
        self.layout, self.tokens = layout, tokens
        self.name = f"tantivy-{layout}-{tokens}"
        self.native_query = tokens == "en_stem"
        self.fields = FIELDS if layout == "fields" else ("rep",)

    def _schema(self) -> Any:
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("id", stored=True, tokenizer_name="raw")
        sb.add_text_field("doc", stored=False, tokenizer_name="raw")
        tok = "whitespace" if self.tokens == "ours" else "en_stem"
        for f in self.fields:
            sb.add_text_field(f, stored=False, tokenizer_name=tok, index_option="freq")
        return sb.build()

    def _doc(self, r: dict[str, Any]) -> Any:
        import tantivy

        if self.layout == "rep":
            text = {"rep": " ".join(rep_tokens(r)) if self.tokens == "ours" else
                    " ".join([r["raw"]["content"]] + [r["raw"]["title"]] * 2 + [r["raw"]["keywords"]] * 3)}
        else:
            text = {f: " ".join(r["stems"][f]) if self.tokens == "ours" else r["raw"][f] for f in FIELDS}
        return tantivy.Document(id=r["id"], doc=r["doc"], **text)

    def build(self, folder: Path, rows: list[dict[str, Any]]) -> None:
        import tantivy

        folder.mkdir(parents=True, exist_ok=True)
        self.index = tantivy.Index(self._schema(), path=str(folder), reuse=False)
        self.writer = self.index.writer(heap_size=128_000_000, num_threads=1)
        for r in rows:
            self.writer.add_document(self._doc(r))
        self.writer.commit()
        self.writer.wait_merging_threads()
        self.writer = None
        self.index.reload()

    def open(self, folder: Path) -> None:
        import tantivy

        self.index = tantivy.Index.open(str(folder))
        self.schema = self.index.schema
        self.writer = None

    def _query(self, terms: list[str], query: str) -> Any:
        import tantivy

        schema = self.index.schema
        if self.native_query:
            boosts = {f: BOOSTS[f] for f in self.fields if f in BOOSTS}
            q, _errors = self.index.parse_query_lenient(query, list(self.fields), field_boosts=boosts)
            return q
        boost = BOOSTS if self.layout == "fields" else {"rep": 1.0}
        return tantivy.Query.boolean_query([
            (tantivy.Occur.Should, tantivy.Query.boost_query(tantivy.Query.term_query(schema, f, t), boost[f]))
            for t in terms for f in self.fields])

    def search(self, terms: list[str], k: int, query: str = "") -> list[tuple[str, float]]:
        if not terms and not self.native_query:
            return []
        searcher = self.index.searcher()
        hits = searcher.search(self._query(terms, query), limit=k, count=False).hits
        return [(searcher.doc(addr)["id"][0], float(score)) for score, addr in hits]

    def _writer(self) -> Any:
        if self.writer is None:
            self.writer = self.index.writer(heap_size=32_000_000, num_threads=1)
        return self.writer

    def add(self, rows: list[dict[str, Any]]) -> None:
        w = self._writer()
        for r in rows:
            w.add_document(self._doc(r))
        w.commit()
        self.index.reload()

    def delete(self, doc: str) -> None:
        w = self._writer()
        w.delete_documents_by_term("doc", doc)
        w.commit()
        self.index.reload()

    def count(self, term: str) -> int:
        import tantivy

        self.index.reload()
        field = self.fields[-1]
        return self.index.searcher().search(tantivy.Query.term_query(self.index.schema, field, term),
                                            limit=1, count=True).count


class Fts5Engine(Engine):
    """SQLite FTS5 (WAL): the chunk table and the full-text table change in one transaction per write."""

    def __init__(self, layout: str = "fields", contentless: bool = False) -> None:
        self.layout, self.contentless = layout, contentless
        self.name = f"fts5-{layout}-ours" + ("-contentless" if contentless else "")
        self.cols = FIELDS if layout == "fields" else ("rep",)
        # A contentless table stores no copy of the tokens; deleting a row needs its tokens again (in
        # production re-derived from the chunk text still in Chroma; here kept from `add`).
        self.written: dict[str, list[tuple[int, tuple[str, ...]]]] = {}

    def _connect(self, folder: Path) -> sqlite3.Connection:
        con = sqlite3.connect(str(folder / "keyword.sqlite3"), isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        return con

    def _values(self, r: dict[str, Any]) -> tuple[str, ...]:
        if self.layout == "rep":
            return (" ".join(rep_tokens(r)),)
        return tuple(" ".join(r["stems"][f]) for f in FIELDS)

    def build(self, folder: Path, rows: list[dict[str, Any]]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.con = self._connect(folder)
        cols = ", ".join(self.cols)
        opts = ", content=''" if self.contentless else ""
        # unicode61 with '_' as a token character and diacritics kept: it splits exactly where our
        # analyzer's tokens end (they are joined by spaces), so FTS5 indexes our stems unchanged.
        self.con.executescript(f"""
            CREATE TABLE chunk(rowid INTEGER PRIMARY KEY, id TEXT UNIQUE, doc TEXT);
            CREATE INDEX chunk_doc ON chunk(doc);
            CREATE VIRTUAL TABLE fts USING fts5({cols}, tokenize="unicode61 remove_diacritics 0 tokenchars '_'"{opts});
        """)
        self._insert(rows)

    def _insert(self, rows: Any, keep: bool = False) -> None:
        marks = ", ".join("?" * (len(self.cols) + 1))
        with self._txn():
            for r in rows:
                rowid = self.con.execute("INSERT INTO chunk(id, doc) VALUES (?, ?)", (r["id"], r["doc"])).lastrowid
                values = self._values(r)
                self.con.execute(f"INSERT INTO fts(rowid, {', '.join(self.cols)}) VALUES ({marks})", (rowid, *values))
                if self.contentless and keep:
                    self.written.setdefault(r["doc"], []).append((rowid, values))

    def _txn(self) -> Any:
        con = self.con

        class Txn:
            def __enter__(self) -> None:
                con.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type: Any, *a: Any) -> None:
                con.execute("ROLLBACK" if exc_type else "COMMIT")
        return Txn()

    def open(self, folder: Path) -> None:
        self.con = self._connect(folder)

    def search(self, terms: list[str], k: int, query: str = "") -> list[tuple[str, float]]:
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        weights = ", ".join(str(BOOSTS[f]) for f in FIELDS) if self.layout == "fields" else "1.0"
        rows = self.con.execute(
            f"SELECT chunk.id, bm25(fts, {weights}) AS s FROM fts JOIN chunk ON chunk.rowid = fts.rowid "
            "WHERE fts MATCH ? ORDER BY s LIMIT ?", (match, k)).fetchall()
        return [(cid, -s) for cid, s in rows]

    def add(self, rows: list[dict[str, Any]]) -> None:
        self._insert(rows, keep=True)

    def delete(self, doc: str) -> None:
        with self._txn():
            if self.contentless:
                marks = ", ".join("?" * (len(self.cols) + 1))
                for rowid, values in self.written.pop(doc, []):
                    self.con.execute(f"INSERT INTO fts(fts, rowid, {', '.join(self.cols)}) VALUES ('delete', {marks})",
                                     (rowid, *values))
            else:
                self.con.execute("DELETE FROM fts WHERE rowid IN (SELECT rowid FROM chunk WHERE doc = ?)", (doc,))
            self.con.execute("DELETE FROM chunk WHERE doc = ?", (doc,))

    def count(self, term: str) -> int:
        return self.con.execute("SELECT count(*) FROM fts WHERE fts MATCH ?", (f'"{term}"',)).fetchone()[0]


def engines() -> dict[str, Any]:
    """Name -> factory of every engine measured."""
    return {"shipped-tantivy": ShippedEngine, "bm25s-mmap": Bm25sEngine,
            "tantivy-fields-ours": lambda: TantivyEngine("fields", "ours"),
            "tantivy-rep-ours": lambda: TantivyEngine("rep", "ours"),
            "tantivy-fields-en_stem": lambda: TantivyEngine("fields", "en_stem"),
            "fts5-fields-ours": lambda: Fts5Engine("fields"), "fts5-rep-ours": lambda: Fts5Engine("rep"),
            "fts5-fields-ours-contentless": lambda: Fts5Engine("fields", contentless=True)}


# -- ranking ------------------------------------------------------------------------------------------
def doc_ranking(hits: list[tuple[str, float]], doc_of: dict[str, str]) -> list[str]:
    """Documents in the order of their best chunk (one slot per document, as `eval` ranks)."""
    return list(dict.fromkeys(doc_of[cid] for cid, _ in hits))


def ranking(sets: list[str], names: list[str], cache_dir: Path | None, work: Path,
            hybrid: bool = False) -> dict[str, dict[str, float]]:
    """nDCG@10 per set and engine (keyword; and hybrid, fused as the service fuses, when `hybrid`)."""
    from research_agent.search.evaluation import ndcg_at_k
    from research_agent.search.keyword_index import Chunk, KeywordIndex

    out: dict[str, dict[str, float]] = {}
    for name in sets:
        chunks = load_chunks(name, cache_dir)
        queries, qrels = judged_queries(name)
        rows = make_rows(chunks, Analyzer())
        ids, doc_of = [r["id"] for r in rows], {r["id"]: r["doc"] for r in rows}
        ref = KeywordIndex([Chunk(c, t, m) for c, t, m in chunks])
        terms = {q: ref.query_terms(text) for q, text in queries.items()}
        vecs, qvecs = dense_side(name, ids, queries, cache_dir) if hybrid else (None, None)
        train = judged_queries(name, 300, "train")[0] if hybrid else {}
        ref_top = bm25s_top(rows, ref, train, work / f"ref-{name}")
        out[name] = {}
        for ename in names:
            eng = engines()[ename]()
            folder = work / f"rank-{name}-{ename}"
            eng.build(folder, rows)
            eng.open(folder)
            scale = score_scale(eng, ref, ref_top, train)
            kw, hy, hs = [], [], []
            for j, q in enumerate(queries):
                hits = eng.search(terms[q], len(ids) if hybrid else DEPTH, queries[q])
                kw.append(ndcg_at_k(doc_ranking(hits[:DEPTH], doc_of)[:10], qrels[q], 10))
                if hybrid:
                    cos = vecs @ qvecs[j]
                    hy.append(ndcg_at_k(hybrid_docs(cos, hits, ids, doc_of)[:10], qrels[q], 10))
                    hs.append(ndcg_at_k(hybrid_docs(cos, hits, ids, doc_of, scale=scale)[:10], qrels[q], 10))
            out[name][ename] = sum(kw) / len(kw)
            if hybrid:
                out[name][f"{ename} hybrid"] = sum(hy) / len(hy)
                out[name][f"{ename} hybrid, scores x{scale:.2f}"] = sum(hs) / len(hs)
            log(f"{name} {ename}: " + ", ".join(f"{k} {v:.4f}" for k, v in out[name].items() if k.startswith(ename)))
            shutil.rmtree(folder, ignore_errors=True)
    return out


def bm25s_top(rows: list[dict[str, Any]], ref: Any, queries: dict[str, str], folder: Path) -> dict[str, Any]:
    """bm25s's best (id, score) per query: the scale the calibration and the adaptive weight were fitted on
    (bm25s-mmap scores exactly as the former KeywordIndex did: BM25 "lucene", k1 1.5, the same tokens)."""
    eng = Bm25sEngine()
    eng.build(folder, rows)
    eng.open(folder)
    return {q: eng.search(ref.query_terms(text), 1) for q, text in queries.items()}


def fit_scale(sets: list[str], cache_dir: Path | None, work: Path) -> dict[str, float]:
    """SCORE_SCALE's recipe: the median over train queries (300 per set, pooled) of bm25s's top score / tantivy's
    (the shipped index's score divided by the constant it applies)."""
    from research_agent.search.keyword_index import SCORE_SCALE, Chunk, KeywordIndex

    out, pooled = {}, []
    for name in sets:
        chunks = load_chunks(name, cache_dir)
        shipped = KeywordIndex([Chunk(c, t, m) for c, t, m in chunks])
        train = judged_queries(name, 300, "train")[0]
        top = bm25s_top(make_rows(chunks, Analyzer()), shipped, train, work / f"scale-{name}")
        ratios = []
        for q, text in train.items():
            mine = shipped.search(text, 1)
            if top[q] and mine and mine[0][1] > 0:
                ratios.append(top[q][0][1] / (mine[0][1] / SCORE_SCALE))
        out[name], pooled = statistics.median(ratios), pooled + ratios
        log(f"{name}: median ratio {out[name]:.4f} over {len(ratios)} train queries")
    out["pooled"] = statistics.median(pooled)
    return out


def score_scale(eng: Engine, ref: Any, ref_top: dict[str, Any], train: dict[str, str]) -> float:
    """Median over train queries of (bm25s's top score / the engine's): puts the engine's scores on the scale the
    adaptive fusion weight was fitted on (train split only, never test)."""
    ratios = []
    for q, text in train.items():
        mine = eng.search(ref.query_terms(text), 1, text)
        if mine and ref_top[q] and mine[0][1] > 0:
            ratios.append(ref_top[q][0][1] / mine[0][1])
    return statistics.median(ratios) if ratios else 1.0


def dense_side(name: str, ids: list[str], queries: dict[str, str], cache_dir: Path | None) -> tuple[Any, Any]:
    """(chunk vectors in `ids` order, query vectors in `queries` order): the stored vectors of the set's store and
    the real embedder's query vectors (cached as .npy beside the chunks). Exact cosine stands in for Chroma's
    HNSW search (at 10k chunks its top 50 is all but exact)."""
    import numpy as np

    cached = cache_dir / f"{name}-vectors.npz" if cache_dir else None
    if cached and cached.is_file():
        got = np.load(cached)
        return got["chunks"], got["queries"]
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.storage.chunks import visible_chunks

    c = build_container()
    c = build_container(store=str(CACHE / name / c.settings.embedding_model.replace("/", "_")))
    col = open_collection(c, name)
    by_id = {cid: vec for cid, _, _, vec in visible_chunks(c.store, name, col, embeddings=True)}
    chunks = np.asarray([by_id[i] for i in ids], dtype="float32")
    chunks /= np.linalg.norm(chunks, axis=1, keepdims=True).clip(min=1e-12)
    qv = np.asarray([c.embedder.embed_query(text) for text in queries.values()], dtype="float32")
    if cached:
        np.savez(cached, chunks=chunks, queries=qv)
    return chunks, qv


def hybrid_docs(cos: Any, kw: list[tuple[str, float]], ids: list[str], doc_of: dict[str, str],
                n: int = 50, scale: float = 1.0) -> list[str]:
    """The shipped hybrid order (retrieve._fuse_pool): dense top n and keyword top n pooled, every score
    completed, convex fusion with the adaptive dense weight, one slot per document. `scale` multiplies the
    keyword scores: min-max fusion ignores it, but the adaptive weight reads the best BM25 score on bm25s's
    scale (calibration.bm25_squash), which another engine's BM25 (k1 1.2, other idf) does not share."""
    import numpy as np

    from research_agent.search.retrieve import fusion_scores

    kw_all = dict(kw)
    pool = [ids[i] for i in np.argsort(-cos)[:n]]
    pool += [cid for cid, _ in kw[:n] if cid not in set(pool)]
    pos = {cid: i for i, cid in enumerate(ids)}
    fused = fusion_scores([float(cos[pos[cid]]) for cid in pool], [kw_all.get(cid, 0.0) * scale for cid in pool], 0.5)
    order = sorted(range(len(pool)), key=lambda i: -fused[i])
    return list(dict.fromkeys(doc_of[pool[i]] for i in order))


# -- costs --------------------------------------------------------------------------------------------
def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def child(args: list[str], timeout: float = CHILD_TIMEOUT) -> subprocess.Popen:
    env = dict(os.environ)
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def open_in_new_process(ename: str, folder: Path, query_terms: list[str], query: str) -> dict[str, float]:
    """Wall time of a new process that imports the engine, opens the index and answers one query."""
    started = time.perf_counter()
    proc = child(["_open", ename, str(folder), json.dumps(query_terms), query])
    out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"open child failed: {err[-2000:]}")
    inner = json.loads(out.strip().splitlines()[-1])
    return {"open_process_s": wall, "open_in_process_s": inner["open_s"], "first_query_s": inner["query_s"]}


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def concurrent_reader(ename: str, folder: Path, eng: Engine, new_rows: list[dict[str, Any]], doc: str) -> dict:
    """A reader process counts MARK chunks in a loop while this process adds then deletes the 10-chunk document;
    consistent when it only ever sees 0 or 10."""
    proc = child(["_reader", ename, str(folder), "8"])
    ready = proc.stdout.readline()   # the reader prints one line once its index is open
    if not ready:
        return {"reader": f"failed: {proc.stderr.read()[-500:]}"}
    for _ in range(3):
        eng.add(new_rows)
        time.sleep(0.3)
        eng.delete(doc)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    seen = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    counts = sorted(int(k) for k in seen)
    return {"reader_counts_seen": counts, "reader_polls": sum(seen.values()),
            "reader_consistent": set(counts) <= {0, len(new_rows)} and len(counts) > 1}


def costs(n: int, names: list[str], cache_dir: Path | None, work: Path, reader: bool) -> dict[str, dict]:
    """Every cost of `names` at n chunks."""
    from research_agent.search.keyword_index import Chunk, KeywordIndex

    base = load_chunks("scifact", cache_dir)
    t = time.perf_counter()
    base_rows = make_rows(base, Analyzer())
    tokenize_s = time.perf_counter() - t
    queries, _ = judged_queries("scifact", 100)
    ref = KeywordIndex([Chunk(c, t_, m) for c, t_, m in base])
    qlist = [(ref.query_terms(text), text) for text in queries.values()]
    extra = make_rows(new_document(base, "new-doc"), Analyzer())
    log(f"our analyzer: {len(base)} chunks tokenized in {tokenize_s:.1f} s")
    out = {}
    for ename in names:
        out[ename] = measure_engine(ename, cycled_rows(base_rows, n), extra, qlist, work / f"cost-{n}-{ename}",
                                    reader)
        out[ename]["tokenize_per_10k_s"] = tokenize_s * 10_000 / len(base)
        log(f"{n} {ename}: {json.dumps(out[ename])}")
    return out


def measure_engine(ename: str, rows: Any, extra: list[dict[str, Any]],
                   qlist: list[tuple[list[str], str]], folder: Path, reader: bool) -> dict[str, Any]:
    shutil.rmtree(folder, ignore_errors=True)
    eng = engines()[ename]()
    res: dict[str, Any] = {"build_s": timed(lambda: eng.build(folder, rows))}
    res["disk_mb"] = folder_size(folder) / 1e6
    res.update(open_in_new_process(ename, folder, *qlist[0]))
    built, eng = eng, engines()[ename]()
    eng.open(folder)
    eng.rows = getattr(built, "rows", None)   # the bm25s engines rebuild from every row on a write
    for terms, text in qlist[:5]:
        eng.search(terms, DEPTH, text)
    lat = []
    for terms, text in qlist:
        lat.append(timed(lambda: eng.search(terms, DEPTH, text)) * 1000)
    res["query_p50_ms"], res["query_p95_ms"] = percentile(lat, 50), percentile(lat, 95)
    res["add_doc_commit_s"] = timed(lambda: eng.add(extra))
    res["delete_doc_commit_s"] = timed(lambda: eng.delete("new-doc"))
    res["disk_after_mb"] = folder_size(folder) / 1e6
    if reader and isinstance(eng, (TantivyEngine, Fts5Engine, ShippedEngine)):
        res.update(concurrent_reader(ename, folder, eng, extra, "new-doc"))
    eng = None
    shutil.rmtree(folder, ignore_errors=True)
    return res


# -- child processes ----------------------------------------------------------------------------------
def child_open(ename: str, folder: str, terms_json: str, query: str) -> None:
    t = time.perf_counter()
    eng = engines()[ename]()
    eng.open(Path(folder))
    open_s = time.perf_counter() - t
    t = time.perf_counter()
    eng.search(json.loads(terms_json), DEPTH, query)
    print(json.dumps({"open_s": open_s, "query_s": time.perf_counter() - t}))


def child_reader(ename: str, folder: str, seconds: str) -> None:
    """Poll the MARK count for `seconds`; print {count: times seen}."""
    eng = engines()[ename]()
    eng.open(Path(folder))
    print("ready", flush=True)
    seen: dict[int, int] = {}
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        n = eng.count(MARK)
        seen[n] = seen.get(n, 0) + 1
    print(json.dumps(seen), flush=True)


# -- kill -9 ---------------------------------------------------------------------------------------------
def child_writer(ename: str, folder: str, tag: str) -> None:
    """Write forever: add document i (10 chunks marked MARK<tag>x<i>), commit, delete document i-1, commit."""
    base = [(f"c{j}", f"chunk text number {j} about cells", {"source_document": "x"}) for j in range(10)]
    an, eng, i = Analyzer(), engines()[ename](), 0
    eng.open(Path(folder))
    make_rows(base, an)   # imports done before "ready", so the kill lands among the writes
    print("ready", flush=True)
    while True:
        rows = make_rows([(f"{tag}d{i}-{cid}", f"{text} {MARK}{tag}x{i}", dict(meta, source_document=f"{tag}d{i}"))
                          for cid, text, meta in base], an)
        eng.add(rows)
        print(f"added {i}", flush=True)
        if i:
            eng.delete(f"{tag}d{i - 1}")
            print(f"deleted {i - 1}", flush=True)
        i += 1


def crash_trials(ename: str, work: Path, trials: int, cache_dir: Path | None) -> dict[str, Any]:
    """kill -9 a writer at a random moment, `trials` times; after each, the index must open, every document
    must be whole (0 or 10 chunks), and a new writer must be able to commit (no stale lock)."""
    import random

    folder = work / f"crash-{ename}"
    shutil.rmtree(folder, ignore_errors=True)
    base = make_rows(load_chunks("scifact", cache_dir)[:2000], Analyzer())
    engines()[ename]().build(folder, base)
    rng, bad, lost, docs_seen = random.Random(16), [], [], 0
    for trial in range(trials):
        proc = child(["_writer", ename, str(folder), str(trial)])
        proc.stdout.readline()
        time.sleep(rng.uniform(0.05, 2.0))
        proc.kill()
        acked = proc.communicate(timeout=CHILD_TIMEOUT)[0].split("\n")
        added = {int(x.split()[1]) for x in acked if x.startswith("added")}
        deleted = {int(x.split()[1]) for x in acked if x.startswith("deleted")}
        eng = engines()[ename]()
        eng.open(folder)
        counts = [eng.count(f"{MARK}{trial}x{i}") for i in range(max(added, default=0) + 2)]
        docs_seen += len(added)
        bad += [(trial, i, n) for i, n in enumerate(counts) if n not in (0, 10)]
        # a commit that returned survives kill -9 (an add whose successor was acknowledged may have been
        # deleted by a commit that returned just before the kill, unacknowledged), and so does a delete
        lost += [(trial, i) for i in added - deleted if i + 1 not in added and counts[i] != 10]
        lost += [(trial, i) for i in deleted if counts[i]]
        eng.add(make_rows([(f"t{trial}", "after the crash", {"source_document": f"t{trial}"})], Analyzer()))
        eng = None
    shutil.rmtree(folder, ignore_errors=True)
    return {"trials": trials, "commits_acknowledged": docs_seen, "partial_documents": bad[:10],
            "acknowledged_but_lost": lost[:10]}


# -- report -------------------------------------------------------------------------------------------
COST_COLUMNS = ("build_s", "disk_mb", "open_process_s", "open_in_process_s", "first_query_s", "query_p50_ms",
                "query_p95_ms", "add_doc_commit_s", "delete_doc_commit_s", "reader_consistent")


def print_tables(result: dict[str, Any]) -> None:
    for name, per in result.get("ranking", {}).items():
        print(f"\n| engine | {name} nDCG@10 |\n|---|---|")
        for ename, v in per.items():
            print(f"| {ename} | {v:.4f} |")
    for n, per in result.get("costs", {}).items():
        print(f"\n{n} chunks\n| engine | " + " | ".join(COST_COLUMNS) + " |\n|---|" + "---|" * len(COST_COLUMNS))
        for ename, r in per.items():
            cells = [fmt(r.get(c)) for c in COST_COLUMNS]
            print(f"| {ename} | " + " | ".join(cells) + " |")


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return "–" if v is None else str(v)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_open":
        child_open(*sys.argv[2:6])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_writer":
        child_writer(*sys.argv[2:5])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_reader":
        child_reader(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("ranking", "costs", "crash", "scale"))
    ap.add_argument("--trials", type=int, default=10, help="kill -9 trials per engine for `crash`")
    ap.add_argument("--sets", default="scifact,nfcorpus")
    ap.add_argument("--engines", default=",".join(engines()))
    ap.add_argument("--chunks", default="10000", help="comma-separated corpus sizes for `costs`")
    ap.add_argument("--hybrid", action="store_true", help="`ranking`: also hybrid nDCG@10 (loads the embedder)")
    ap.add_argument("--no-reader", action="store_true", help="skip the concurrent-reader check")
    ap.add_argument("--chunks-cache", default=None, help="keep the sets' chunks as JSON here (repeat runs)")
    ap.add_argument("--work", default=None, help="folder for the indexes (default: a temporary one)")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    names = [e for e in args.engines.split(",") if e]
    cache_dir = Path(args.chunks_cache) if args.chunks_cache else None
    work = Path(args.work or tempfile.mkdtemp(prefix="kwengines-"))
    result: dict[str, Any] = {}
    if args.what == "ranking":
        result["ranking"] = ranking(args.sets.split(","), names, cache_dir, work, args.hybrid)
    elif args.what == "scale":
        result["scale"] = fit_scale(args.sets.split(","), cache_dir, work)
        print(json.dumps(result["scale"]))
    elif args.what == "crash":
        result["crash"] = {e: crash_trials(e, work, args.trials, cache_dir) for e in names}
        log(json.dumps(result["crash"]))
    else:
        result["costs"] = {int(n): costs(int(n), names, cache_dir, work, not args.no_reader)
                           for n in args.chunks.split(",")}
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print_tables(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
