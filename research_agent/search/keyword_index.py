"""The keyword (BM25) index of a collection: a tantivy index saved with the store and updated per document.

Engine (issue 16, measured in benchmarks/README.md "Keyword engines for issue 16"): tantivy (tantivy-py 0.27)
with one indexed field, `body`, holding our analyzer's stems of the text BM25 has always seen: the content,
the title (document title + header path) repeated `title_weight` times and the front-matter keywords/tags
repeated `keywords_weight` times (the ACDC boosts content 1, title 2, keywords 3: BM25F with integer field
weights, which beat per-field indexes summed, 0.687 vs 0.633 on SciFact). tantivy's own `whitespace`
tokenizer splits the stems back apart, so tokens are exactly ours: lowercased words of 2+ characters, the
Lucene English stop words, Snowball English stems (research_agent.text). tantivy scores BM25 with k1 1.2
(bm25s used 1.5) and includes the (k1 + 1) factor bm25s's "lucene" variant leaves out, so its scores are
~2.4x larger; every score is multiplied by `SCORE_SCALE` (0.4213: the median ratio of bm25s's top score to
tantivy's over SciFact/NFCorpus train queries), which keeps the fitted calibration (calibration.bm25_squash)
and the adaptive fusion weight valid. Measured: SciFact keyword 0.678 / hybrid 0.724, NFCorpus 0.318 / 0.367.

Each indexed chunk stores its id, its document key (`doc`, what a per-document update deletes by), its text
and its metadata (JSON), so a hit is answered from the index alone and no process keeps the collection's text
in memory (the bm25s design held every chunk's text and metadata: GBs at a million chunks).

The index's state is kept per document (layout 3, issue 16): each document's first chunk in a commit also
carries the document's key (`sdoc`) and content hash (`ver`) and the role `state`; a document with no visible
chunk gets a stand-alone entry instead (`id = "\x00state:<key>"`, roles `state` and `alone`, no body). Both
share the document's `doc` term, so the delete that removes a document's chunks removes its state with them,
and its new chunks bring the new state in the same commit. One small global entry, `id = "_state"`, holds the
collection revision and the change-log position. A catch-up therefore writes what changed: one document's
chunks and ~200 bytes of state, where layout 2's single state entry (one hash per document, ~9 MB of JSON at
100k documents) was re-encoded and rewritten by every commit (~0.2 s of each catch-up at 100k, growing
with N). The state rides on chunks rather than in entries of its own because tantivy's BM25 counts every
entry, bodiless or deleted, in N and in the average length: an entry per document would double N at one chunk
per document and change every score (20 bodiless entries beside 20 chunks moved a score from 0.99 to 1.14).
A tantivy commit publishes atomically (one meta.json replace), so a reader sees a document's old chunks and
state or its new ones, never a half.

Keeping the index in step with the store is search/keyword_sync.py's (catch-up, locks, recovery).

Over 400 lines because the schema, the per-document state written in each commit (`apply`) and the readers
of that state and of the chunks (`versions_of`, `top`, `scores_of`) are one invariant: a commit holds a
document's chunks and its state together. Split, a change to the schema or the state's layout would touch
two modules that must change in step (ANALYZER_VERSION names both).

Typo tolerance: a query word whose stem is in no chunk is replaced by the strings within one edit (insertion,
deletion, substitution or adjacent transposition) whose stems are in the index, most frequent first (at most
`MAX_CORRECTIONS`); frequencies are the index's document frequencies, so nothing extra is kept. Candidates are
about 72 x length strings; words longer than `MAX_CORRECTABLE_LEN` are not corrected (a 2,000-character word's
candidates took ~300 MB).

Filters (`where`, search/filters.py's predicate on a chunk's metadata) are applied to the ranked matches in a
growing window (FILTER_WINDOW, x4 until k chunks pass or every match was seen), so the k best accepted chunks
are the same as masking every chunk before the cut.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from research_agent.storage.chunks import visible_chunks
from research_agent.text import keyword_words, stemmer

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

#: Bump when tokens, stems, stop words, the schema or the state's layout change: the folder name carries it,
#: so an index of another version is never opened (a new one is built beside it, the old one removed).
#: 3: per-document state on chunks (module docstring); 2: one state entry with every document's hash.
ANALYZER_VERSION = 3
#: Field weights as repetition counts (the ACDC spec's boosts; content counts once).
TITLE_WEIGHT = 2
KEYWORD_WEIGHT = 3
#: Corrections per misspelt query word, and the shortest word we try to correct (short words have too
#: many neighbours within one edit to guess which was meant).
MAX_CORRECTIONS = 3
MIN_CORRECTABLE_LEN = 4
#: The longest word we try to correct: English words and identifiers worth guessing are shorter, and the
#: candidate set grows with the square of the length (see the module docstring).
MAX_CORRECTABLE_LEN = 32
#: tantivy's BM25 -> bm25s's scale (module docstring): the median ratio of bm25s's top score to tantivy's over
#: 600 train queries (300 each of SciFact and NFCorpus; 0.4200 and 0.4243 alone), never test queries;
#: `benchmarks/keyword_engines.py scale` reproduces it.
SCORE_SCALE = 0.4213
#: The first window of ranked matches a filter is applied to (grown x4 while too few pass): 400 covers the
#: default 60 candidates with 1 in 7 passing in one search.
FILTER_WINDOW = 400
#: The indexing buffer of one catch-up (tantivy's minimum is 15 MB): 64 MB flushes a segment every ~50k chunks.
WRITER_HEAP_BYTES = 64_000_000

STATE_ID = "_state"
_STATE_DOC = "\x00state"   # no document key is this (keys are file names, research:/note: names)
_ALONE_PREFIX = "\x00state:"  # the id of a chunkless document's state entry (no chunk id starts with NUL)
_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass
class Chunk:
    id: str
    text: str
    metadata: dict[str, Any]


@dataclass
class IndexState:
    """The global entry: the collection revision the index reflects and the change-log position (nanoseconds
    of the change record that announced `revision`; 0 = none) and the Chroma collection id the index was built
    from (None: written before it was kept; an index of another id is never used). Documents' hashes are per
    document (`versions_of`)."""

    revision: str | None = None
    log_at: int = 0
    collection: str | None = None
    #: Change records of the skew window this index has applied (search/keyword_sync.py: the first
    #: `APPLIED_ID_CHARS` of each one's token, oldest first, at most MAX_APPLIED), all stamped at or after
    #: `applied_from` (ns). Committed with the chunks, so a kill -9 never separates them.
    applied: tuple[str, ...] = ()
    applied_from: int = 0


@dataclass
class Written:
    """What one `apply` wrote: index entries added (chunks + stand-alone state entries + the global one) and
    the bytes of state among them (keys, hashes, the global entry). Tests and benchmarks read it to show a
    catch-up's writes follow the change, not the corpus."""

    chunks: int = 0
    entries: int = 0
    state_bytes: int = 0


@dataclass
class Ranking:
    """One query against one searcher (a fixed commit): its stems and filter; `top` and `scores_of` read it."""

    terms: list[str]
    where: Callable[[dict[str, Any]], bool] | None
    searcher: Any
    query: Any


def edits1(word: str) -> set[str]:
    """Every string one insertion, deletion, substitution or adjacent transposition away from `word`."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    deletes = [a + b[1:] for a, b in splits if b]
    transposes = [a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1]
    replaces = [a + ch + b[1:] for a, b in splits if b for ch in _LETTERS if ch != b[0]]
    inserts = [a + ch + b for a, b in splits for ch in _LETTERS]
    return set(deletes + transposes + replaces + inserts)


def index_text(chunk: Chunk, weights: tuple[int, int]) -> str:
    """The text BM25 sees: content, title x weights[0], keywords x weights[1].

    Title, header path and keywords are capped here too (chunks stored before the caps hold them whole): a
    long title repeated in every chunk's index text made keyword queries take 38 s and 2 GB.
    """
    from research_agent.ingest.chunking import TITLE_MAX_CHARS, cap_header_path, cap_list, cap_text

    meta = chunk.metadata
    title = f"{cap_text(str(meta.get('document_title') or ''), TITLE_MAX_CHARS)} " \
            f"{cap_header_path(str(meta.get('header_path') or ''))}".strip()
    kw = meta.get("keywords") or []
    keywords = " ".join(cap_list([str(k) for k in (kw if isinstance(kw, list) else [kw])]))
    return " ".join([chunk.text] + [title] * weights[0] + [keywords] * weights[1])


def _schema() -> Any:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("id", stored=True, tokenizer_name="raw")
    sb.add_text_field("doc", stored=False, tokenizer_name="raw")
    sb.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="freq")
    sb.add_bytes_field("text", stored=True)
    sb.add_bytes_field("meta", stored=True)
    sb.add_text_field("sdoc", stored=True, tokenizer_name="raw")   # the document whose state this entry holds
    sb.add_bytes_field("ver", stored=True)                          # ... and its content hash
    sb.add_text_field("role", stored=False, tokenizer_name="raw")  # "state" on holders; + "alone" if chunkless
    return sb.build()


class KeywordIndex:
    """BM25 with field weights, stemming, stop words and one-edit typo tolerance over one collection's chunks.

    `KeywordIndex(chunks)` builds one in memory (tests, benchmarks); `KeywordIndex.open(path, weights)` opens
    or creates the one saved in `path`. Updates go through `apply`, one commit each.
    """

    def __init__(self, chunks: Iterable[Chunk] = (), weights: tuple[int, int] | None = None, *,
                 path: Path | None = None) -> None:
        import tantivy

        self.weights = tuple(max(0, int(w)) for w in (weights or (TITLE_WEIGHT, KEYWORD_WEIGHT)))
        self.path = path
        self._stem_cache: dict[str, str] = {}
        self._index = tantivy.Index(_schema(), path=None if path is None else str(path), reuse=True)
        self._stamp = self._commit_stamp()
        self._refresh()
        self.written = Written()
        pairs = [(str(ch.metadata.get("source_document", ch.id)), ch) for ch in chunks]
        if pairs:
            self.apply([], pairs, IndexState(), {doc: "" for doc, _ in pairs})

    @classmethod
    def open(cls, path: Path, weights: tuple[int, int]) -> "KeywordIndex":
        """The index saved in `path` (created empty if the folder is new); raises if it is damaged."""
        path.mkdir(parents=True, exist_ok=True)
        if not (path / "meta.json").exists() and any(f.suffix not in (".lock",) for f in path.iterdir()):
            raise ValueError("meta.json is missing")  # tantivy would start an empty index over the segments
        index = cls(weights=weights, path=path)
        index.check()
        return index

    # -- reading -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        self._searcher = self._index.searcher()
        self.state = self._read_state(self._searcher)

    def reload(self) -> None:
        """See the newest commit (another process's catch-up, or our own). Every commit replaces meta.json, so
        an unchanged one means nothing to reload (a reload reads one small global entry)."""
        stamp = self._commit_stamp()
        if stamp is not None and stamp == self._stamp:
            return
        self._index.reload()
        self._refresh()
        self._stamp = stamp

    def _commit_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = (self.path / "meta.json").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _read_state(self, searcher: Any) -> IndexState:
        import tantivy

        hits = searcher.search(tantivy.Query.term_query(self._index.schema, "id", STATE_ID), limit=1).hits
        self.has_state = bool(hits)
        if not hits:
            return IndexState()
        raw = json.loads(searcher.doc(hits[0][1])["meta"][0].decode("utf-8"))
        return IndexState(revision=raw.get("revision"), log_at=int(raw.get("log_at", 0)),
                          collection=raw.get("collection"), applied=tuple(raw.get("applied", ())),
                          applied_from=int(raw.get("applied_from", 0)))

    def versions_of(self, documents: Iterable[str]) -> dict[str, str]:
        """{document: content hash} of the named documents the index holds (a catch-up from the log: reads
        only their state, whatever the corpus size)."""
        import tantivy

        docs = sorted(set(documents))
        if not docs:
            return {}
        return self._versions(tantivy.Query.term_set_query(self._index.schema, "sdoc", docs), len(docs))

    def all_versions(self) -> dict[str, str]:
        """{document: content hash} of every document the index holds: the full diff's side (the rare path;
        one stored entry read per document, ~0.7 s per 100k documents)."""
        import tantivy

        q = tantivy.Query.term_query(self._index.schema, "role", "state")
        return self._versions(q, self._searcher.num_docs)

    def _versions(self, query: Any, limit: int) -> dict[str, str]:
        searcher = self._searcher
        out = {}
        for _, addr in searcher.search(query, limit=max(1, limit)).hits:
            doc = searcher.doc(addr)
            out[doc["sdoc"][0]] = doc["ver"][0].decode("utf-8")
        return out

    def _count(self, field_name: str, value: str) -> int:
        import tantivy

        q = tantivy.Query.term_query(self._index.schema, field_name, value)
        return int(self._searcher.search(q, limit=1, count=True).count)

    def check(self) -> None:
        """Read every segment's term dictionary and postings once: a truncated or altered file raises here,
        not in the middle of a query (tantivy opens segment files lazily)."""
        import tantivy

        searcher = self._searcher
        if searcher.num_docs and not self.has_state:
            raise ValueError("the index holds chunks but no state entry")
        for term in ("the", "data", "a"):
            searcher.search(tantivy.Query.term_query(self._index.schema, "body", term), limit=1, count=True)
        searcher.search(tantivy.Query.all_query(), limit=1, count=True)

    def __len__(self) -> int:
        """Chunks held (state entries are not chunks)."""
        return self._searcher.num_docs - int(self.has_state) - self._count("role", "alone")

    # -- writing -------------------------------------------------------------------------------
    def _document(self, ch: Chunk, doc: str, version: str | None = None) -> Any:
        """A chunk's entry; with `version`, it also holds its document's state (module docstring)."""
        import tantivy

        body = " ".join(self.tokens(ch))
        meta = json.dumps(ch.metadata, ensure_ascii=False).encode("utf-8")
        entry = tantivy.Document(id=ch.id, doc=doc, body=body, text=ch.text.encode("utf-8"), meta=meta)
        if version is not None:
            entry.add_text("sdoc", doc)
            entry.add_bytes("ver", version.encode("utf-8"))
            entry.add_text("role", "state")
        return entry

    @staticmethod
    def _alone(doc: str, version: str) -> Any:
        """The state entry of a document with no visible chunk (no body: never matches a query)."""
        import tantivy

        return tantivy.Document(id=_ALONE_PREFIX + doc, doc=doc, sdoc=doc, ver=version.encode("utf-8"),
                                role=["state", "alone"])

    def tokens(self, ch: Chunk) -> list[str]:
        words = keyword_words(index_text(ch, self.weights))
        todo = [w for w in set(words) if w not in self._stem_cache]
        if todo:
            if len(self._stem_cache) > 500_000:  # bounded: a long-lived process sees every word once
                self._stem_cache.clear()
            self._stem_cache.update(zip(todo, stemmer().stemWords(todo)))
        return [self._stem_cache[w] for w in words]

    def apply(self, documents: Iterable[str], chunks: Iterable[tuple[str, Chunk]], state: IndexState,
              versions: dict[str, str] | None = None, *, replace_all: bool = False) -> Written:
        """One commit: every entry of each of `documents` deleted, chunks and state alike (or every entry,
        `replace_all`), then `chunks` ((document, chunk) pairs, streamed) added, each document of `versions`
        given its state (on its first chunk, or alone), and the global entry replaced. Deletes come first
        because tantivy applies a delete to everything added before it in the commit. Idempotent, so a
        catch-up killed before the commit is simply run again (none of it was published: tantivy writes
        segments but only the commit's meta.json names them). Without `versions` (benchmarks of the engine
        alone) no document gets a state entry."""
        versions = versions or {}
        writer = self._index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
        written = Written()
        try:
            if replace_all:
                writer.delete_all_documents()
            for doc in documents:
                writer.delete_documents_by_term("doc", doc)
            held = self._add_chunks(writer, chunks, versions, written)
            for doc in sorted(versions.keys() - held):
                writer.add_document(self._alone(doc, versions[doc]))
                written.entries += 1
                written.state_bytes += len(doc) + len(versions[doc])
            self._replace_global(writer, state, written)
            writer.commit()
        finally:
            writer.wait_merging_threads()  # releases tantivy's writer lock for the next catch-up (any process)
        self.written = written
        self.reload()
        return written

    def _add_chunks(self, writer: Any, chunks: Iterable[tuple[str, Chunk]], versions: dict[str, str],
                    written: Written) -> set[str]:
        """Add the chunks, the first of each document of `versions` holding its state; returns those documents."""
        held: set[str] = set()
        for doc, ch in chunks:
            version = versions.get(doc) if doc not in held else None
            writer.add_document(self._document(ch, doc, version))
            if version is not None:
                held.add(doc)
                written.state_bytes += len(doc) + len(version)
            written.entries += 1
            written.chunks += 1
        return held

    @staticmethod
    def _replace_global(writer: Any, state: IndexState, written: Written) -> None:
        import tantivy

        writer.delete_documents_by_term("id", STATE_ID)
        fields = {"revision": state.revision, "log_at": state.log_at, "layout": ANALYZER_VERSION,
                  "collection": state.collection}
        if state.applied:  # absent otherwise: the entry stays as small as before (~150 bytes)
            fields.update(applied=list(state.applied), applied_from=state.applied_from)
        raw = json.dumps(fields, sort_keys=True).encode("utf-8")
        writer.add_document(tantivy.Document(id=STATE_ID, doc=_STATE_DOC, meta=raw))
        written.entries += 1
        written.state_bytes += len(raw)

    # -- querying ------------------------------------------------------------------------------
    def stem(self, word: str) -> str:
        s = self._stem_cache.get(word)
        if s is None:
            s = stemmer().stemWord(word)  # this thread's: a cached index serves many
            if len(self._stem_cache) < 500_000:
                self._stem_cache[word] = s
        return s

    def _freq(self, stem: str, searcher: Any | None = None) -> int:
        return int((searcher or self._searcher).doc_freq("body", stem))

    def corrections(self, word: str) -> list[str]:
        """Words one edit from `word` whose stems the index holds, most frequent first, one per stem (empty for
        short, long or numeric words)."""
        if not MIN_CORRECTABLE_LEN <= len(word) <= MAX_CORRECTABLE_LEN or word.isdigit():
            return []
        candidates = sorted(edits1(word))
        best: dict[str, tuple[int, str]] = {}   # stem -> (chunks holding it, its first candidate in order)
        for cand, stem in zip(candidates, stemmer().stemWords(candidates)):
            if stem not in best:
                best[stem] = (self._freq(stem), cand)
        found = sorted((fc for fc in best.values() if fc[0]), key=lambda fc: (-fc[0], fc[1]))
        return [cand for _, cand in found[:MAX_CORRECTIONS]]

    def query_terms(self, query: str) -> list[str]:
        """The query's stems that the index knows, misspelt words replaced by their corrections."""
        terms: list[str] = []
        for word in keyword_words(query):
            stem = self.stem(word)
            if self._freq(stem):
                terms.append(stem)
            else:
                terms.extend(self.stem(w) for w in self.corrections(word))
        return list(dict.fromkeys(terms))

    def rank(self, query: str, where: Callable[[dict[str, Any]], bool] | None = None) -> Ranking | None:
        """The query's ranking (read by `top` and `scores_of`); None if no term is known."""
        import tantivy

        terms = self.query_terms(query)
        if not terms:
            return None
        schema = self._index.schema
        q = tantivy.Query.boolean_query([(tantivy.Occur.Should, tantivy.Query.term_query(schema, "body", t))
                                         for t in terms])
        return Ranking(terms, where, self._searcher, q)

    def _hits(self, ranking: Ranking, limit: int) -> list[tuple[Chunk, float]]:
        searcher = ranking.searcher
        out = []
        for score, addr in searcher.search(ranking.query, limit=limit).hits:
            doc = searcher.doc(addr)
            meta = json.loads(doc["meta"][0].decode("utf-8"))
            out.append((Chunk(doc["id"][0], doc["text"][0].decode("utf-8"), meta), float(score) * SCORE_SCALE))
        return out

    def top(self, ranking: Ranking | None, k: int) -> list[tuple[Chunk, float]]:
        """The `k` best chunks of a `rank` result (those `where` accepts), best first."""
        if ranking is None or k <= 0:
            return []
        if ranking.where is None:
            return self._hits(ranking, k)
        window = max(FILTER_WINDOW, 4 * k)
        while True:
            hits = self._hits(ranking, window)
            kept = [(ch, sc) for ch, sc in hits if ranking.where(ch.metadata)]
            if len(kept) >= k or len(hits) < window:
                return kept[:k]
            window *= 4

    def scores_of(self, ranking: Ranking | None, ids: list[str]) -> dict[str, float]:
        """The BM25 score of each chunk in `ids` (0 for chunks without a query term): fusion completes dense-only
        candidates with it. A search restricted to the ids (a zero-scored filter clause), so the scores are
        exactly those of `top`."""
        import tantivy

        if ranking is None or not ids:
            return {cid: 0.0 for cid in ids}
        Q, schema = tantivy.Query, self._index.schema
        only = Q.const_score_query(Q.term_set_query(schema, "id", list(ids)), 0.0)
        q = Q.boolean_query([(tantivy.Occur.Must, ranking.query), (tantivy.Occur.Must, only)])
        searcher = ranking.searcher
        got = {searcher.doc(addr)["id"][0]: float(score) * SCORE_SCALE
               for score, addr in searcher.search(q, limit=len(ids)).hits}
        return {cid: got.get(cid, 0.0) for cid in ids}

    def search(self, query: str, k: int, *, where: Callable[[dict[str, Any]], bool] | None = None
               ) -> list[tuple[Chunk, float]]:
        """The top `k` chunks with a positive score; `where` keeps only chunks whose metadata it accepts."""
        return self.top(self.rank(query, where), k)


def active_chunks(c: Container, collection: str, col: Any) -> list[Chunk]:
    """Every chunk of the collection whose document manifest points at its version."""
    return [Chunk(cid, doc, meta) for cid, doc, meta, _ in visible_chunks(c.store, collection, col)]


def field_weights(settings: Any) -> tuple[int, int]:
    return settings.keyword_title_weight, settings.keyword_keywords_weight


def cache_home() -> Path:
    """Per-user cache folder, XDG style: where derived files of a Chroma server's collections live."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "research-agent"


def persist_folder(c: Container, col: Any) -> Path:
    """Where this collection's index lives: inside the embedded store (it goes where the store goes), or for
    a Chroma server in the user's cache, one folder per server location."""
    if c.store.kind == "embedded":
        root = Path(c.settings.store) / "keyword-index"
    else:
        root = cache_home() / "keyword-index" / hashlib.sha1(c.store.location.encode()).hexdigest()[:16]
    return root / str(col.id)


def keyword_index(c: Container, collection: str, col: Any) -> KeywordIndex:
    """The collection's index, caught up with its current revision (search/keyword_sync.py)."""
    from research_agent.search.keyword_sync import keyword_index as synced

    return synced(c, collection, col)
