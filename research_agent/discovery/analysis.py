"""Text analysis for discovery: first sentences, dates, token counts, plain text.

Discovery matches a task to nodes by stemmed content words: `terms` is
research_agent.text's `discovery_terms` analyzer (its stop list drops the verbs every task starts with but
keeps action words such as "create" and "get"), re-exported under the name discovery has always exported.
"""

from __future__ import annotations

import re
from datetime import date

from research_agent.text import discovery_terms as terms

__all__ = ["terms", "first_sentence", "parse_date", "count_tokens", "to_plain"]

_PLAIN_RULES = [
    (re.compile(r"^ {0,3}#{1,6}\s*", re.M), ""),
    (re.compile(r"^ {0,3}(```|~~~).*$\n?", re.M), ""),
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?!\w)"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"<!--.*?-->", re.S), ""),
]


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
