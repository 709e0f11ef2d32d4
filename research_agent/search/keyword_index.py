"""The keyword (BM25) index of a collection, rebuilt from Chroma whenever its revision changes.

Chroma's own sparse index is not available in the embedded store, so each process keeps a bm25s
index per collection, keyed by (store, Chroma collection id) and stamped with the collection's
revision from the store registry. Every write (any process, embedded or server) bumps that revision,
and the next search rebuilds the index from the active chunks, so it never serves stale text.
The built index is also saved with the store (`<store>/keyword-index/<collection id>/<revision>-...`; for a
Chroma server under the user's cache folder), so a new process (a CLI query) loads it in ~0.3 s instead of
rebuilding it (~4 s at 10k chunks). Saves are atomic (temporary folder + rename), checked by size and CRC-32
when loaded, and one per collection is kept; anything that does not load is removed and rebuilt.

Ranking: BM25 (bm25s defaults k1=1.5, b=0.75) over one text per chunk: the content, the title
(document title + header path) repeated `title_weight` times and the front-matter keywords/tags repeated
`keywords_weight` times (the ACDC spec's boosts: content 1, title 2, keywords 3). Repetition is BM25F with
integer field weights: a field's term frequencies count w times. Measured on SciFact it beat per-field
BM25 indexes summed with the same weights (nDCG@10 0.687 vs 0.633; the short title field saturates and
then dominates), see benchmarks/README.md.
Tokens: lowercased words of 2+ characters, the Lucene English stop words, Snowball English stems
(research_agent.text.keyword_words and text.stemmer).

Typo tolerance: a query word whose stem is in no field's vocabulary is replaced by the corpus words
within one edit (insertion, deletion, substitution or adjacent transposition) of it, most frequent
first (at most `MAX_CORRECTIONS`). Candidates are generated from the query word (about 72 x length
strings) and looked up in the corpus word set, so there is nothing extra to build with the index. Words
longer than `MAX_CORRECTABLE_LEN` are not corrected: the candidates of an n-character word take about
72 n^2 bytes, so a 2,000-character word cost ~300 MB of peak memory (measured), a 32-character one ~0.2 MB.

Over 400 lines because the index, its saved copy and its per-revision cache are one lifecycle (build, save,
load, prune) that the query path reads as a unit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from research_agent.storage.chunks import visible_chunks
from research_agent.storage.revision_cache import RevisionCache
from research_agent.text import keyword_words, stemmer

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

#: Bump when tokens, stems, stop words or the saved layout change: persisted indexes of another
#: version are ignored and rebuilt.
ANALYZER_VERSION = 1
#: A half-written folder older than this is an abandoned save (a killed process) and is removed; a save at
#: 10k chunks takes about 1 s, so an hour never removes one in progress.
ABANDONED_SAVE_SECONDS = 3600
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

_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
_FORMAT = f"research-agent keyword index {ANALYZER_VERSION}"
# bm25s methods whose scores are the saved matrix alone (BM25L and BM25+ add a non-occurrence term).
_NO_NONOCCURRENCE = ("lucene", "robertson", "atire")
_TMP = ".tmp-"

#: (store, Chroma collection id) -> the index, stamped (revision, field weights); one build per key at a time.
_cache: RevisionCache[KeywordIndex] = RevisionCache()


@dataclass
class Chunk:
    id: str
    text: str
    metadata: dict[str, Any]


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


class SavedScores:
    """The part of bm25s.BM25 a saved index needs (vocab_dict, get_scores_from_ids), read from what
    `BM25.save` wrote with numpy alone: importing bm25s pulls in scipy.sparse, ~0.35 s of a ~1.5 s CLI query.
    Scores are summed as bm25s 0.3 does (np.add.at per query term, in term order), so they are identical."""

    def __init__(self, folder: Path) -> None:
        import numpy as np

        params = json.loads((folder / "params.index.json").read_text(encoding="utf-8"))
        if params.get("method") not in _NO_NONOCCURRENCE:
            raise ValueError(f"BM25 method {params.get('method')!r} is not read without bm25s")
        self.vocab_dict: dict[str, int] = json.loads((folder / "vocab.index.json").read_text(encoding="utf-8"))
        self.data, self.indices, self.indptr = (np.load(folder / f"{name}.csc.index.npy", allow_pickle=False)
                                                for name in ("data", "indices", "indptr"))
        self.num_docs = int(params["num_docs"])
        self.dtype = np.dtype(params["dtype"])
        self._np = np

    def get_scores_from_ids(self, ids: list[int]) -> Any:
        np = self._np
        scores = np.zeros(self.num_docs, dtype=self.dtype)
        for t in ids:
            start, end = self.indptr[t], self.indptr[t + 1]
            np.add.at(scores, self.indices[start:end], self.data[start:end])
        return scores


class KeywordIndex:
    """BM25 with field weights, stemming, stop words and one-edit typo tolerance over one collection's chunks."""

    def __init__(self, chunks: list[Chunk], weights: tuple[int, int] | None = None) -> None:
        import bm25s

        self._setup(chunks, weights)
        if not chunks:
            return
        tokenized = [keyword_words(index_text(ch, self.weights)) for ch in chunks]
        for doc in tokenized:
            for w in set(doc):
                self.word_freq[w] = self.word_freq.get(w, 0) + 1
        surface = sorted(self.word_freq)
        self.stem_of = dict(zip(surface, stemmer().stemWords(surface)))
        self.retriever = bm25s.BM25()
        self.retriever.index([[self.stem_of[w] for w in doc] for doc in tokenized], show_progress=False)

    def _setup(self, chunks: list[Chunk], weights: tuple[int, int] | None) -> None:
        import numpy as np

        self.chunks = chunks
        self.position = {ch.id: i for i, ch in enumerate(chunks)}
        self.weights = tuple(max(0, int(w)) for w in (weights or (TITLE_WEIGHT, KEYWORD_WEIGHT)))
        self._stem_cache: dict[str, str] = {}
        self.retriever: Any = None
        self.word_freq: dict[str, int] = {}   # surface word -> number of chunks containing it
        self.stem_of: dict[str, str] = {}
        self._np = np

    def save(self, folder: Path) -> None:
        """Write the index into `folder` (new, empty): bm25s's arrays, the chunks and the word tables, then
        manifest.json with every file's size and CRC-32 (written last: a folder without it is incomplete)."""
        folder.mkdir(parents=True)
        if self.retriever is not None:
            self.retriever.save(str(folder / "bm25"), show_progress=False)
        tables = {"weights": list(self.weights), "ids": [ch.id for ch in self.chunks],
                  "texts": [ch.text for ch in self.chunks], "metadatas": [ch.metadata for ch in self.chunks],
                  "word_freq": self.word_freq, "stem_of": self.stem_of}
        (folder / "chunks.json").write_text(json.dumps(tables, ensure_ascii=False), encoding="utf-8")
        files = {str(f.relative_to(folder)): _checksum(f) for f in sorted(folder.rglob("*")) if f.is_file()}
        manifest = {"format": _FORMAT, "files": files}
        (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> "KeywordIndex":
        """The index `save` wrote; any missing, truncated or altered file raises (the caller rebuilds)."""
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        if manifest.get("format") != _FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {_FORMAT!r}")
        listed = manifest.get("files") or {}
        present = {str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()} - {"manifest.json"}
        if set(listed) != present or "chunks.json" not in present:
            # A manifest listing fewer files than the folder holds would skip their checksums (an edited
            # chunks.json was served as content): every file must be listed, and chunks.json must exist.
            raise ValueError("the manifest does not list exactly the files present")
        for name, expected in listed.items():
            if _checksum(folder / name) != expected:
                raise ValueError(f"{name} does not match its checksum")
        tables = json.loads((folder / "chunks.json").read_text(encoding="utf-8"))
        index = cls.__new__(cls)
        chunks = [Chunk(i, t, m) for i, t, m in zip(tables["ids"], tables["texts"], tables["metadatas"], strict=True)]
        index._setup(chunks, tuple(tables["weights"]))
        index.word_freq, index.stem_of = tables["word_freq"], tables["stem_of"]
        if chunks:
            index.retriever = SavedScores(folder / "bm25")
            if index.retriever.num_docs != len(chunks):
                raise ValueError("the BM25 arrays and the chunk list disagree")
        return index

    def __len__(self) -> int:
        return len(self.chunks)

    def stem(self, word: str) -> str:
        s = self.stem_of.get(word) or self._stem_cache.get(word)
        if s is None:
            s = self._stem_cache[word] = stemmer().stemWord(word)  # this thread's: a cached index serves many
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
        for word in keyword_words(query):
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
        """Every chunk's score for `query` (numpy, chunk order; 0 where `where` rejects); None if no term is known."""
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


def active_chunks(c: Container, collection: str, col: Any) -> list[Chunk]:
    """Every chunk of the collection whose document manifest points at its version."""
    return [Chunk(cid, doc, meta) for cid, doc, meta, _ in visible_chunks(c.store, collection, col)]


def field_weights(settings: Any) -> tuple[int, int]:
    return settings.keyword_title_weight, settings.keyword_keywords_weight


def _checksum(path: Path) -> list[int]:
    """[size, CRC-32]: catches truncation and altered bytes at ~1 GB/s (20 MB at 10k chunks: ~20 ms)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return [size, crc]


def cache_home() -> Path:
    """Per-user cache folder, XDG style: where derived files of a Chroma server's collections live."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "research-agent"


def persist_folder(c: Container, col: Any) -> Path:
    """Where this collection's saved indexes live: inside the embedded store (they go where the store goes),
    or for a Chroma server in the user's cache, one folder per server location."""
    if c.store.kind == "embedded":
        root = Path(c.settings.store) / "keyword-index"
    else:
        root = cache_home() / "keyword-index" / hashlib.sha1(c.store.location.encode()).hexdigest()[:16]
    return root / str(col.id)


def _entry_name(rev: str, weights: tuple[int, int]) -> str:
    from importlib.metadata import version  # not `import bm25s`: see SavedScores

    return f"{rev}-w{weights[0]}.{weights[1]}-a{ANALYZER_VERSION}-bm25s{version('bm25s')}"


def load_persisted(folder: Path, name: str) -> KeywordIndex | None:
    """The saved index `name`, or None when there is none or it does not load (it is then removed)."""
    path = folder / name
    if not path.is_dir():
        return None
    try:
        return KeywordIndex.load(path)
    except Exception as exc:  # truncated, altered, older format: never trusted, rebuilt by the caller
        log.warning("keyword index at %s is unusable (%s); rebuilding it", path, exc)
        _remove(path, _OURS)
        return None


def persist(index: KeywordIndex, folder: Path, name: str) -> None:
    """Save `index` as `folder/name` atomically (a temporary folder renamed into place), then remove the
    other revisions. A failure (disk full, read-only store) only costs the next process a rebuild."""
    tmp = folder / f"{_TMP}{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        index.save(tmp)
        os.rename(tmp, folder / name)  # fails if another process saved it first: theirs is as good
    except OSError as exc:
        if not (folder / name).is_dir():
            log.warning("could not save the keyword index in %s: %s", folder, exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    prune(folder, keep=name)


#: What we name: saved indexes (`_entry_name`), half-written saves, and collection folders (Chroma's UUIDs).
#: Pruning removes nothing else, and never through a symlink: a user who moved the folder to another disk
#: with a link, or keeps other files beside ours, lost folders there before.
_OURS = re.compile(r"[\w.-]+-w\d+\.\d+-a\d+-bm25s[\w.+-]+|" + re.escape(_TMP) + r"[0-9a-f]{32}")
_COLLECTION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _remove(entry: Path, pattern: re.Pattern[str]) -> None:
    """rmtree `entry` if it is a real folder with one of our names; anything else is left alone."""
    if pattern.fullmatch(entry.name) and not entry.is_symlink() and entry.is_dir():
        shutil.rmtree(entry, ignore_errors=True)


def prune(folder: Path, keep: str) -> None:
    """Remove saved indexes other than `keep`, and abandoned half-written ones (bounded disk: one per collection)."""
    for entry in folder.iterdir():
        if entry.name == keep:
            continue
        if entry.name.startswith(_TMP):
            try:
                if time.time() - entry.stat().st_mtime < ABANDONED_SAVE_SECONDS:
                    continue  # another process is saving right now
            except OSError:
                continue
        _remove(entry, _OURS)


def keyword_index(c: Container, collection: str, col: Any) -> KeywordIndex:
    """The index at the collection's current revision: this process's copy, else the one saved with the store
    by any process, else built from Chroma and saved (about 4 s at 10k chunks, against ~0.3 s to load).

    The first query after a write (any process) rebuilds; the saved copy is keyed by Chroma collection id,
    revision, field weights and analyzer version, so a stale or foreign one is never used.
    """
    key = (c.store.location, str(col.id))
    weights = tuple(field_weights(c.settings))
    rev = c.store.revision(collection)
    # One build per collection at a time: concurrent queries wait for it instead of repeating it.
    return _cache.get_or_build(key, (rev, weights), lambda: _load_or_build(c, collection, col, rev, weights))


def _load_or_build(c: Container, collection: str, col: Any, rev: str, weights: tuple[int, int]) -> KeywordIndex:
    folder, name = persist_folder(c, col), _entry_name(rev, weights)
    index = load_persisted(folder, name)
    if index is not None and index.weights == weights:
        return index
    index = KeywordIndex(active_chunks(c, collection, col), weights)
    # Saved only if no write landed while the chunks were read (a Chroma server has no read gate): a copy
    # stamped with a revision whose content it does not hold would outlive this process.
    if c.store.revision(collection) == rev:
        persist(index, folder, name)
        prune_collections(c, folder)
    return index


def prune_collections(c: Container, folder: Path) -> None:
    """Remove the saved indexes of collections that no longer exist (deleted, or replaced by `kb reindex`,
    which fills a new Chroma collection): without this each reindex left ~20 MB behind at 10k chunks."""
    try:
        live = {str(getattr(col, "id", "")) for col in c.store.client.list_collections()}
        for entry in folder.parent.iterdir():
            if entry != folder and entry.name not in live:
                _remove(entry, _COLLECTION_ID)
    except Exception as exc:  # best effort: a leftover only costs disk
        log.debug("could not prune saved keyword indexes in %s: %s", folder.parent, exc)
