"""Text analysis for discovery: first sentences, dates, token counts, plain text.

Discovery matches a task to nodes by stemmed content words: `terms` is
research_agent.text's `discovery_terms` analyzer (its stop list drops the verbs every task starts with but
keeps action words such as "create" and "get") plus the non-Latin words the keyword index sees.
"""

from __future__ import annotations

import re
from datetime import date

from research_agent.text import discovery_terms, keyword_words

__all__ = ["terms", "identifiers", "defined_identifiers", "first_sentence", "parse_date", "count_tokens", "to_plain"]

def terms(text: str) -> list[str]:
    """Discovery's terms: discovery_terms' stems, then the keyword index's words that are not ASCII.

    Why: discovery_terms reads only `[A-Za-z][A-Za-z0-9]+`, so a CJK or Cyrillic task had no terms at all
    (`discover "获取实时天气"` best 0.04, nothing listed, while `query` found the section at rank 1). Taking
    the other words from keyword_words (`\\w\\w+`, a CJK run is one word) matches them exactly as the keyword
    index does. ASCII text gets exactly discovery_terms' list, so English scores cannot move.
    """
    stems = discovery_terms(text)
    if text.isascii():
        return stems
    return stems + [w for w in keyword_words(text) if not w.isascii()]


#: Markdown markup -> its text. Every rule is linear in the text: a scan that may fail stops at the next
#: character that could start another try ("[" for links and their targets, "*" for emphasis), so no two
#: tries scan the same characters. The old `.+?` / `[^\]]*` scans ran to the end of the line or text from every
#: unclosed opener: 100 KB of " *a" or "[" took over 20 s (tests/test_discovery_text_linear.py).
_PLAIN_RULES = [
    (re.compile(r"^ {0,3}#{1,6}\s*", re.M), ""),
    (re.compile(r"^ {0,3}(```|~~~).*$\n?", re.M), ""),
    (re.compile(r"!?\[([^\[\]]*)\]\([^)\[]*\)"), r"\1"),
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),  # linear: an opener fails only when no closer follows on its line
    (re.compile(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?!\w)"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
]
#: A first sentence is cut at 240 characters; scanning this much of the body gives the same answer (a sentence
#: end found past 240 is cut to the same 240 characters) and keeps the search's cost fixed.
_SENTENCE_CUT = 240
_SENTENCE_SCAN = _SENTENCE_CUT + 2
_SENTENCE = re.compile(r"(.{20,}?[.!?])(\s|$)")


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


#: Where a code-like word is defined rather than mentioned: after a defining keyword (`def compute_x`,
#: `class RevisionCacheKey`, `const maxChars`), or leading its line and followed by `=` or `:` (`RESERVED_PREFIX =
#: "__ra_"`, `node_id: str`, a YAML key). A comment (`# TODO: compute_x`) or prose never leads its line with
#: the word, so it stays a mention (issue 14, fourth round: a TODO comment outranked the definition).
_DEFINITION = re.compile(
    r"\b(?:def|class|const|let|var|function|fn|func|type|struct|enum|interface|trait|macro)\s+([A-Za-z_][\w]*)"
    r"|^[ \t]*(?:export[ \t]+)?([A-Za-z_]\w*)[ \t]*(?::(?!:)|=(?!=))", re.M)


def defined_identifiers(text: str) -> set[str]:
    """The code-like words (lowercased, as `identifiers` keys them) that `text` defines (see _DEFINITION)."""
    names = {a or b for a, b in _DEFINITION.findall(text)}
    return {n.lower() for n in names if n and len(n) >= _MIN_IDENTIFIER and _IDENTIFIER.fullmatch(n)}


def first_sentence(text: str, header_line: bool = True) -> str:
    """The first sentence of at least 20 characters (at most 240), skipping the header, fences and tables."""
    lines = text.split("\n")
    if header_line and lines and lines[0].lstrip().startswith("#"):
        lines = lines[1:]
    body = " ".join(line.strip() for line in lines if line.strip() and not line.strip().startswith(("```", "|")))
    # Why the prefix: the search tries every start position and each scans to the end of what it is given,
    # so on the whole of a 60 KB note without punctuation it took about 30 s (02b7f3e); on 242 characters it is
    # constant. A match past the prefix's end ends at 242 or later and is cut to the same 240 characters.
    m = _SENTENCE.search(body[:_SENTENCE_SCAN])
    sentence = m.group(1) if m else body
    return sentence[:_SENTENCE_CUT]


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
    text = _without_comments(markdown)
    for pattern, repl in _PLAIN_RULES:
        text = pattern.sub(repl, text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _without_comments(text: str) -> str:
    """`text` without its closed HTML comments (`<!-- ... -->`, across lines); an unclosed one stays.

    Why not `<!--.*?-->`: from every unclosed "<!--" the search scanned to the end, 7 s on 100 KB of "<!--".
    Here each character is looked at once: after an opener without a closer no later opener can close either.
    """
    parts, start = [], 0
    while (begin := text.find("<!--", start)) != -1:
        end = text.find("-->", begin + 4)
        if end == -1:
            break
        parts.append(text[start:begin])
        start = end + 3
    parts.append(text[start:])
    return "".join(parts)
