"""Text analysis for discovery: content words, first sentences, dates, token counts, plain text.

Discovery matches a task to nodes by *stemmed content words* (the IDF-weighted coverage in
ranking.py), so it needs its own stop list: besides English function words it drops the verbs every
task starts with ("add", "implement", "write"), which would otherwise match every node.

Duplicates to unify into one research_agent/text.py (issue 13): `terms` and `_STOP` overlap
keyword.words/keyword.STOP_WORDS (a different token pattern and a 33-word Lucene list), `_stemmer`
repeats keyword._stemmer (this one is cached, that one is not), and query._SUGGEST_STOP is a third
stop list.
"""

from __future__ import annotations

import re
from datetime import date
from functools import lru_cache
from typing import Any

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+")
_STOP = frozenset("""
a about above after again all also an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further had has have having here how i if in into is it
its itself just me more most my no nor not now of off on once only or other our ours out over own same should so
some such than that the their them then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours
add adding make making write writing create implement new find decide ensure get use using need needs want sure
change changes way ways thing things sometimes since without within across via per one two etc
""".split())

_PLAIN_RULES = [
    (re.compile(r"^ {0,3}#{1,6}\s*", re.M), ""),
    (re.compile(r"^ {0,3}(```|~~~).*$\n?", re.M), ""),
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?!\w)"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"<!--.*?-->", re.S), ""),
]


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def terms(text: str) -> list[str]:
    """Stemmed content words of `text` (lowercase, stop words and one-letter words dropped)."""
    words = [w.lower() for w in _WORD.findall(text)]
    words = [w for w in words if w not in _STOP]
    return _stemmer().stemWords(words) if words else []


def surface_words(text: str) -> dict[str, str]:
    """Stem -> the first word of `text` that stems to it, so reasons quote the task's own words."""
    surface: dict[str, str] = {}
    for word in _WORD.findall(text):
        st = terms(word)
        if st:
            surface.setdefault(st[0], word.lower())
    return surface


def first_sentence(text: str, header_line: bool = True) -> str:
    """The first sentence of at least 20 characters (at most 240), skipping the header, fences and tables."""
    lines = text.split("\n")
    if header_line and lines and lines[0].lstrip().startswith("#"):
        lines = lines[1:]
    body = " ".join(line.strip() for line in lines if line.strip() and not line.strip().startswith(("```", "|")))
    m = re.search(r"(.{20,}?[.!?])(\s|$)", body)
    sentence = m.group(1) if m else body
    return sentence[:240]


def parse_date(value: str | None) -> date | None:
    """An ISO date from the first 10 characters of `value`, or None when it is not one."""
    if not value:
        return None
    try:
        return date.fromisoformat(str(value)[:10])
    except ValueError:
        return None


def count_tokens(text: str) -> int:
    """Estimated tokens, the chunker's estimate, so retrieve_knowledge and discovery agree."""
    from research_agent.ingest.chunking import estimate_tokens

    return estimate_tokens(text)


def to_plain(markdown: str) -> str:
    """Markdown without its markup: headers, emphasis, links and fences go, their text stays."""
    text = markdown
    for pattern, repl in _PLAIN_RULES:
        text = pattern.sub(repl, text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
