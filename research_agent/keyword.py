"""The keyword (BM25) index of a collection, rebuilt from Chroma whenever its revision changes.

Chroma's own sparse index is not available in the embedded store, so each process keeps a bm25s
index per collection, keyed by (store, Chroma collection id) and stamped with the collection's
revision from the store registry. Every write (any process, embedded or server) bumps that revision,
and the next search rebuilds the index from the active chunks, so it never serves stale text.

Ranking: BM25 (bm25s defaults k1=1.5, b=0.75) over one text per chunk: the content, the title
(document title + header path) repeated `title_weight` times and the front-matter keywords/tags repeated
`keywords_weight` times (the ACDC spec's boosts: content 1, title 2, keywords 3). Repetition is BM25F with
integer field weights: a field's term frequencies count w times. Measured on SciFact it beat per-field
BM25 indexes summed with the same weights (nDCG@10 0.687 vs 0.633; the short title field saturates and
then dominates), see benchmarks/README.md.
Tokens: lowercased words of 2+ characters, the Lucene English stop words, Snowball English stems.

Typo tolerance: a query word whose stem is in no field's vocabulary is replaced by the corpus words
within one edit (insertion, deletion, substitution or adjacent transposition) of it, most frequent
first (at most `MAX_CORRECTIONS`). Candidates are generated from the query word (about 72 x length
strings) and looked up in the corpus word set, so there is nothing extra to build with the index. Words
longer than `MAX_CORRECTABLE_LEN` are not corrected: the candidates of an n-character word take about
72 n^2 bytes, so a 2,000-character word cost ~300 MB of peak memory (measured), a 32-character one ~0.2 MB.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

_PAGE = 5000
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

# The Lucene/Elasticsearch English stop words (bm25s's "en" list).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split())
_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"

_cache: dict[tuple[str, str], tuple[int, "KeywordIndex"]] = {}  # (store, Chroma collection id)
_cache_lock = threading.Lock()
_build_locks: dict[tuple[str, str], threading.Lock] = {}


@dataclass
class Chunk:
    id: str
    text: str
    metadata: dict[str, Any]


def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def words(text: str) -> list[str]:
    """Lowercased word tokens without stop words (before stemming)."""
    return [w for w in _TOKEN.findall(text.lower()) if w not in STOP_WORDS]


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


class KeywordIndex:
    """BM25 with field weights, stemming, stop words and one-edit typo tolerance over one collection's chunks."""

    def __init__(self, chunks: list[Chunk], weights: tuple[int, int] | None = None) -> None:
        import bm25s
        import numpy as np

        self.chunks = chunks
        self.position = {ch.id: i for i, ch in enumerate(chunks)}
        self.weights = tuple(max(0, int(w)) for w in (weights or (TITLE_WEIGHT, KEYWORD_WEIGHT)))
        self._stem_cache: dict[str, str] = {}
        self.stemmer = _stemmer()
        self.retriever: Any = None
        self.word_freq: dict[str, int] = {}   # surface word -> number of chunks containing it
        self.stem_of: dict[str, str] = {}
        self._np = np
        if not chunks:
            return
        tokenized = [words(index_text(ch, self.weights)) for ch in chunks]
        for doc in tokenized:
            for w in set(doc):
                self.word_freq[w] = self.word_freq.get(w, 0) + 1
        surface = sorted(self.word_freq)
        self.stem_of = dict(zip(surface, self.stemmer.stemWords(surface)))
        self.retriever = bm25s.BM25()
        self.retriever.index([[self.stem_of[w] for w in doc] for doc in tokenized], show_progress=False)

    def __len__(self) -> int:
        return len(self.chunks)

    def stem(self, word: str) -> str:
        s = self.stem_of.get(word) or self._stem_cache.get(word)
        if s is None:
            s = self._stem_cache[word] = self.stemmer.stemWord(word)
        return s

    def _known(self, stem: str) -> bool:
        return stem in self.retriever.vocab_dict

    def corrections(self, word: str) -> list[str]:
        """Corpus words one edit from `word`, most frequent first (empty for short, long or numeric words)."""
        if not MIN_CORRECTABLE_LEN <= len(word) <= MAX_CORRECTABLE_LEN or word.isdigit():
            return []
        found = [w for w in edits1(word) if w in self.word_freq]
        found.sort(key=lambda w: (-self.word_freq[w], w))
        return found[:MAX_CORRECTIONS]

    def query_terms(self, query: str) -> list[str]:
        """The query's stems that the index knows, misspelt words replaced by their corrections."""
        if self.retriever is None:
            return []
        terms: list[str] = []
        for word in words(query):
            stem = self.stem(word)
            if self._known(stem):
                terms.append(stem)
            else:
                terms.extend(self.stem(w) for w in self.corrections(word))
        return list(dict.fromkeys(terms))

    def scores(self, terms: list[str]) -> Any:
        """The BM25 score of every chunk (a numpy array in chunk order)."""
        ids = [self.retriever.vocab_dict[t] for t in terms if t in self.retriever.vocab_dict]
        if not ids:
            return self._np.zeros(len(self.chunks), dtype="float32")
        return self.retriever.get_scores_from_ids(ids)

    def mask(self, predicate: Callable[[dict[str, Any]], bool] | None) -> Any:
        if predicate is None:
            return None
        return self._np.fromiter((predicate(ch.metadata) for ch in self.chunks), dtype=bool, count=len(self.chunks))

    def rank(self, query: str, where: Callable[[dict[str, Any]], bool] | None = None) -> Any:
        """Every chunk's score for `query` (numpy, chunk order; 0 where `where` rejects), or None if no term is known."""
        terms = self.query_terms(query)
        if not terms:
            return None
        scores = self.scores(terms)
        allowed = self.mask(where)
        return scores if allowed is None else self._np.where(allowed, scores, 0.0)

    def top(self, scores: Any, k: int) -> list[tuple[Chunk, float]]:
        """The `k` best chunks of a `rank` result with a positive score, best first."""
        np = self._np
        if scores is None or not self.chunks or k <= 0:
            return []
        k = min(k, len(self.chunks))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(self.chunks[int(i)], float(scores[i])) for i in top if scores[i] > 0]

    def search(self, query: str, k: int, *, where: Callable[[dict[str, Any]], bool] | None = None
               ) -> list[tuple[Chunk, float]]:
        """The top `k` chunks with a positive score; `where` keeps only chunks whose metadata it accepts."""
        return self.top(self.rank(query, where), k)


def active_chunks(c, collection: str, col: Any) -> list[Chunk]:
    """Every chunk of the collection whose document manifest points at its version."""
    manifests = c.store.registry_find("document", collection)
    current = {m["document"]: m["content_hash"] for m in manifests.values()}
    out: list[Chunk] = []
    offset = 0
    while True:
        res = col.get(include=["documents", "metadatas"], limit=_PAGE, offset=offset)
        for cid, doc, meta in zip(res["ids"], res["documents"], res["metadatas"]):
            if current.get(meta.get("source_document")) == meta.get("content_hash"):
                out.append(Chunk(cid, doc, meta))
        if len(res["ids"]) < _PAGE:
            return out
        offset += _PAGE


def field_weights(settings: Any) -> tuple[int, int]:
    return settings.keyword_title_weight, settings.keyword_keywords_weight


def keyword_index(c, collection: str, col: Any) -> KeywordIndex:
    """The cached index, rebuilt when the collection's revision moved (any process's write)."""
    key = (c.store.location, str(col.id))
    weights = field_weights(c.settings)
    rev = c.store.revision(collection)
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] == rev and hit[1].weights == weights:
            return hit[1]
        build_lock = _build_locks.setdefault(key, threading.Lock())
    # One build per collection at a time: concurrent queries wait for it instead of repeating it.
    with build_lock:
        with _cache_lock:
            hit = _cache.get(key)
            if hit and hit[0] == rev and hit[1].weights == weights:
                return hit[1]
        index = KeywordIndex(active_chunks(c, collection, col), weights)
        with _cache_lock:
            _cache[key] = (rev, index)
    return index
