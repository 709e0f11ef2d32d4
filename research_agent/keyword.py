"""The keyword (BM25) index of a collection, rebuilt from Chroma whenever its revision changes."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

_PAGE = 5000
# Field boosts by repetition (the ACDC spec's weights): keywords 3x, title 2x, content 1x.
TITLE_BOOST = 2
KEYWORD_BOOST = 3

_cache: dict[tuple[str, str], tuple[int, "KeywordIndex"]] = {}  # (store, Chroma collection id)
_cache_lock = threading.Lock()


@dataclass
class Chunk:
    id: str
    text: str
    metadata: dict[str, Any]


def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def index_text(text: str, meta: dict[str, Any]) -> str:
    title = f"{meta.get('document_title', '')} {meta.get('header_path', '')}"
    keywords = " ".join(meta.get("keywords") or [])
    return " ".join([text] + [title] * TITLE_BOOST + [keywords] * KEYWORD_BOOST)


class KeywordIndex:
    """BM25 with English stemming and stop words over the active chunks of one collection."""

    def __init__(self, chunks: list[Chunk]) -> None:
        import bm25s

        self.chunks = chunks
        self.stemmer = _stemmer()
        self.retriever = None
        if chunks:
            tokens = bm25s.tokenize([index_text(c.text, c.metadata) for c in chunks], stopwords="en",
                                    stemmer=self.stemmer, show_progress=False)
            self.retriever = bm25s.BM25()
            self.retriever.index(tokens, show_progress=False)
            self.vocab = set(self.retriever.vocab_dict)

    def query_terms(self, query: str) -> list[str]:
        import bm25s

        terms = bm25s.tokenize([query], stopwords="en", stemmer=self.stemmer, return_ids=False,
                               show_progress=False)[0]
        return [t for t in terms if t in self.vocab] if self.retriever is not None else []

    def search(self, query: str, k: int) -> list[tuple[Chunk, float]]:
        terms = self.query_terms(query)
        if not terms:
            return []
        k = min(k, len(self.chunks))
        docs, scores = self.retriever.retrieve([terms], k=k, show_progress=False, n_threads=1)
        return [(self.chunks[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


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


def keyword_index(c, collection: str, col: Any) -> KeywordIndex:
    """The cached index, rebuilt when the collection's revision moved (any process's write)."""
    key = (c.store.location, str(col.id))
    rev = c.store.revision(collection)
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] == rev:
            return hit[1]
    index = KeywordIndex(active_chunks(c, collection, col))
    with _cache_lock:
        _cache[key] = (rev, index)
    return index
