"""Text analysis for discovery: first sentences, dates, token counts, plain text.

Discovery matches a task to nodes by stemmed content words: `terms` is
research_agent.text's `discovery_terms` analyzer (its stop list drops the verbs every task starts with but
keeps action words such as "create" and "get"), re-exported under the name discovery has always exported.
"""

from __future__ import annotations

import re
from datetime import date

from research_agent.text import discovery_terms as terms

__all__ = ["terms", "identifiers", "first_sentence", "parse_date", "count_tokens", "to_plain"]

_PLAIN_RULES = [
    (re.compile(r"^ {0,3}#{1,6}\s*", re.M), ""),
    (re.compile(r"^ {0,3}(```|~~~).*$\n?", re.M), ""),
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?!\w)"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"<!--.*?-->", re.S), ""),
]


#: A code-like word: snake_case or UPPER_CASE with an inner underscore (`RESERVED_PREFIX`, `node_id`),
#: camelCase (`discoverContext`), or PascalCase of three or more parts (`RevisionCacheKey`). Two-part
#: PascalCase is left out: it is mostly brand names ("GitHub", "YouTube", "PubMed"), and a generated file
#: holding "GitHub" once took a no-match task about GitHub Actions over 0.5 (tests/test_discovery.py salad).
_IDENTIFIER = re.compile(r"\b(?:[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+|[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*"
                         r"|[A-Z][a-z0-9]+[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*)\b")
#: Identifiers shorter than this ("a_b", "iPad") are too short to name one thing.
_MIN_IDENTIFIER = 5


def identifiers(text: str) -> dict[str, str]:
    """The code-like words of `text`: lowercased -> as first written; the exact names a task may quote.

    Why: the content-word analyzer splits `RESERVED_PREFIX` into "reserved" and "prefix", two words a code
    base uses everywhere, so a task naming the identifier found its one defining file no better than any
    file about prefixes (issue 14, third round). Matching is case-insensitive ("reserved_prefix" names it too).
    """
    found: dict[str, str] = {}
    for m in _IDENTIFIER.findall(text):
        if len(m) >= _MIN_IDENTIFIER:
            found.setdefault(m.lower(), m)
    return found


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
