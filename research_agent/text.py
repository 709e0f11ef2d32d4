"""Text analysis: the one place for tokenizers, stop words, the stemmer and query-centred snippets.

Three analyzers sit side by side. They differ on purpose, and each one's numbers were measured with it, so
none may drift into another (the keyword index's saved files carry ANALYZER_VERSION for that reason):

- `keyword_words`: BM25 tokens (search/keyword_index.py). Lowercased words of 2+ characters (`\\w\\w+`,
  digits and underscores included) minus the 33 Lucene/Elasticsearch English stop words (bm25s's "en"
  list). SciFact nDCG@10 0.687 was measured with exactly this.
- `discovery_terms`: discovery's stemmed content words (node terms and task words, discovery/ranking.py's
  IDF-weighted coverage). Words start with a letter (`[A-Za-z][A-Za-z0-9]+`); the stop list drops the verbs
  every task starts with ("implement", "write") but keeps action words ("create", "add", "get"), which tell
  catalog tools apart. `content_terms` is the same with the action words dropped too: what the boosts'
  file-proximity rule (discovery/boosts.py) was measured with.
- `suggestion_words` with SUGGEST_STOP_WORDS: refinement suggestions (search/refine.py). Letters and
  hyphens of 3+ characters; a broader list of function words that are never worth suggesting.

All three stem with `stemmer()`: Snowball English (PyStemmer), one instance per thread, built once.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any

# -- clean input --------------------------------------------------------------------------------------
#: A lone UTF-16 surrogate: what Python makes of undecodable bytes (argv and stdin use surrogateescape, so
#: `caf\xe9` in Latin-1 arrives as "caf\udce9") and what a JSON "\udcff" escape decodes to. It cannot be
#: encoded as UTF-8, so PyStemmer raised TypeError and Chroma UnicodeEncodeError (exit 1, "Unexpected failure").
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD, as a UTF-8 decoder with errors="replace" would.

    Why here: every face (CLI argv and stdin, MCP JSON) can hand the library such a string, and the tokenizers,
    the embedder and Chroma all need text that encodes as UTF-8. ASCII text (most of it) returns at once.
    """
    if text.isascii():
        return text
    return _LONE_SURROGATE.sub("\ufffd", text)


def checked_text(value: Any, limit: int, *, name: str, empty: str, too_long: str) -> str:
    """A query-like argument (a query, a task description): a non-blank string of at most `limit` characters,
    stripped and cleaned (clean_text); a coded QueryError naming `name`, with guidance `empty` or `too_long`,
    otherwise. One check for search and discovery, so the two cannot drift."""
    from research_agent.errors import QueryError

    if not isinstance(value, str) or not value.strip():
        raise QueryError(f"The {name} is empty", guidance=empty)
    if len(value) > limit:
        raise QueryError(f"The {name} has {len(value)} characters; the limit is {limit}", guidance=too_long)
    return clean_text(value.strip())


# -- the stemmer ------------------------------------------------------------------------------------
_local = threading.local()


def stemmer() -> Any:
    """The Snowball English stemmer of this thread, built on first use (~1 ms) and kept.

    Why one per thread: a PyStemmer object keeps a mutable word cache and C state, and the MCP server runs
    tool calls in worker threads; an instance per thread is never shared by two concurrent calls.
    """
    stem = getattr(_local, "stemmer", None)
    if stem is None:
        import Stemmer

        stem = _local.stemmer = Stemmer.Stemmer("english")
    return stem


# -- keyword (BM25) analyzer ------------------------------------------------------------------------
#: The Lucene/Elasticsearch English stop words (bm25s's "en" list).
KEYWORD_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split())
_KEYWORD_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def keyword_words(text: str) -> list[str]:
    """Lowercased word tokens without stop words (before stemming): what BM25 indexes and queries with."""
    return [w for w in _KEYWORD_TOKEN.findall(text.lower()) if w not in KEYWORD_STOP_WORDS]


# -- content-word analyzer (discovery) --------------------------------------------------------------
_CONTENT_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+")
#: English function words plus the verbs and fillers of task descriptions.
CONTENT_STOP_WORDS = frozenset("""
a about above after again all also an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further had has have having here how i if in into is it
its itself just me more most my no nor not now of off on once only or other our ours out over own same should so
some such than that the their them then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours
add adding make making write writing create implement new find decide ensure get use using need needs want sure
change changes way ways thing things sometimes since without within across via per one two etc
""".split())


def content_terms(text: str) -> list[str]:
    """Stemmed content words of `text` (lowercase, stop words and one-letter words dropped)."""
    words = [w.lower() for w in _CONTENT_WORD.findall(text)]
    words = [w for w in words if w not in CONTENT_STOP_WORDS]
    return stemmer().stemWords(words) if words else []


#: discovery_terms' stop list: CONTENT_STOP_WORDS without the action words. Why: in a tool catalog the
#: action is the task ("file a new bug report" wants create_issue, not update_issue; "keep it as a draft"
#: wants create_draft, not send_draft), so "add", "create", "new", "get", "find", "change" stay content
#: words; only the verbs that introduce any task ("implement", "write", "make", "use", "need") and true
#: function words go (issue 14).
DISCOVERY_STOP_WORDS = CONTENT_STOP_WORDS - frozenset("add adding create new find get change changes".split())


def discovery_terms(text: str) -> list[str]:
    """Discovery's stemmed content words: content_terms, but action words ("create", "get") are kept."""
    words = [w.lower() for w in _CONTENT_WORD.findall(text)]
    words = [w for w in words if w not in DISCOVERY_STOP_WORDS]
    return stemmer().stemWords(words) if words else []


def surface_words(text: str, analyzer: Any = None) -> dict[str, str]:
    """Stem -> the first word of `text` that stems to it, so reasons quote the task's own words.

    `analyzer` is the stemming analyzer the stems came from (content_terms unless given).
    """
    analyze = analyzer or content_terms
    surface: dict[str, str] = {}
    for word in _CONTENT_WORD.findall(text):
        st = analyze(word)
        if st:
            surface.setdefault(st[0], word.lower())
    return surface


# -- suggestion analyzer (query refinement) ---------------------------------------------------------
_SUGGEST_WORD = re.compile(r"[A-Za-z][A-Za-z-]{2,}")
#: Function words never suggested as refinements (broader than the BM25 stop list).
SUGGEST_STOP_WORDS = frozenset(
    "the and for with that this from are was were has have had not but you your can use used using how what when "
    "where which who whom why into over under about will would should could does did its it's our their there these "
    "those then than them they also such may might must been being each other more most some any all both only very "
    "just one two three here onto upon via per between after before while during without within across among out "
    "off own same so too yet nor him her his hers she its itself we us is be an as at by if in it no of on or to "
    "shall etc i.e e.g new see".split())


def suggestion_words(text: str) -> list[str]:
    """Words of 3+ letters or hyphens, starting with a letter, as written (case kept)."""
    return _SUGGEST_WORD.findall(text)


# -- snippets -----------------------------------------------------------------------------------------
_PIECE = re.compile(r"\S+")
_EDGE = re.compile(r"^\W+|\W+$")


def snippet(text: str, query: str, max_tokens: int = 60, marks: bool = True) -> str:
    """The window of about `max_tokens` tokens of `text` that holds the most distinct query terms.

    Ties go to the earlier window; a cut is marked with an ellipsis unless `marks` is False. Text within the
    budget is returned whole. Terms are the keyword analyzer's stems, so the window holds what BM25 matched.
    """
    from research_agent.ingest.chunking import estimate_tokens

    if estimate_tokens(text) <= max_tokens:
        return text
    stem = stemmer()
    wanted = set(stem.stemWords(keyword_words(query)))
    pieces = [(m.start(), m.end(), estimate_tokens(m.group())) for m in _PIECE.finditer(text)]
    stems = stem.stemWords([_EDGE.sub("", text[a:b]).lower() for a, b, _ in pieces])
    i, j = _best_window([p[2] for p in pieces], [s in wanted and s for s in stems], max_tokens)
    out = text[pieces[i][0]:pieces[j - 1][1]]
    if not marks:
        return out
    return ("… " if i > 0 else "") + out + (" …" if j < len(pieces) else "")


def _best_window(sizes: list[int], terms: list[Any], budget: int) -> tuple[int, int]:
    """[i, j) of the pieces within `budget` tokens with the most distinct, then most, terms (falsy: none).

    A sliding window: j advances while the window fits (a window holds at least one piece), i steps on.
    """
    best, best_score = (0, 0), (-1, -1)
    j, used = 0, 0
    counts: Counter[str] = Counter()
    for i in range(len(sizes)):
        while j < len(sizes) and (used + sizes[j] <= budget or j == i):
            used += sizes[j]
            if terms[j]:
                counts[terms[j]] += 1
            j += 1
        score = (len(counts), sum(counts.values()))
        if score > best_score:
            best, best_score = (i, j), score
        used -= sizes[i]
        if terms[i]:
            counts[terms[i]] -= 1
            if not counts[terms[i]]:
                del counts[terms[i]]
    return best
