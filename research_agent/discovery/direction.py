"""Direction of a conversion: which side of it a task holds, and which side a tool takes as its input.

Why: "I have a street address and need its latitude and longitude" ranked a reverse-geocoding tool (0.79) over
the geocoding one on the ToolGym catalog (issue 14): both tools say "address", "coordinates", "convert", and
the reverse one even names latitude and longitude, as its *parameters*. Words and cosine cannot tell which
way a conversion runs; the task's phrasing ("have X ... need Y", "turn X into Y", "from X, get Y") and the
tool's shape (its parameters and the "X into Y" of its description or `x_to_y` name are what it takes; the rest
of its description is what it gives) can.

The feature is neutral (0) unless both sides exist and both vote the same way: a task without a have/need or
convert-into phrasing, a lookup ("from Hacker News get the best stories"), any node without a `Parameters:`
line (curated knowledge, a server's intro), and a tool that matches only one of the task's sides get 0, so
the golden knowledge base is scored exactly as before (issue 14, A5's attack: with one side enough, "convert
WKT into SVG" gave wkt_to_geojson +0.5 and 0.85).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from research_agent.discovery.analysis import terms

#: "I have / given / from X ... need / want / get / into / to Y" (the have side ends at the first need word).
_HAVE_NEED = re.compile(r"\b(?:have|has|got|given|from)\b(?P<have>.+?)(?:\b(?:needs?|wants?|get|into|to)\b|->|→)"
                        r"(?P<need>.+)", re.I | re.S)
#: "convert / turn / translate X into / to Y" (also a tool description: "Convert an address into coordinates").
_CONVERT_INTO = re.compile(r"\b(?:convert|converts|turn|turns|translate|transform|encode|decode)\b(?P<have>.+?)"
                           r"(?:\b(?:into|to)\b|->|→)(?P<need>.+)", re.I | re.S)
#: A tool name read as "X to Y" once its separators are spaces: `geojson_to_kml`, `speech-to-text`, `radiansToDegrees`.
_NAME_TO = re.compile(r"^(?P<have>.+?)\b(?:to|into)\b(?P<need>.+)$", re.I)
#: One clause at a time: a have side never runs past a full stop ("e.g.," is not one), a need side never swallows
#: the next request ("... need GeoJSON and also I have TopoJSON ...", "into KML and then print it", issue 14 A5).
_SENTENCE_END = re.compile(r"[.!?;](?:\s|$)|\n|,?\s+and\s+also\b|,?\s+(?:and\s+)?then\b", re.I)
#: "from X get Y" / "given X get Y" is a lookup, not a conversion ("from Hacker News get the best stories": the
#: service is no input), unless the clause also says have/need or a conversion verb (issue 14 A5: hn_best 0.76 -> 0.49).
#: "into" stays one: "from my feature branch into main" read as sides kept create_pull_request first (ToolGym dev).
_CONVERSION_WORD = re.compile(r"\b(?:have|has|got|needs?|wants?|into|convert\w*|turns?|transform\w*|translat\w*|"
                              r"encod\w*|decod\w*|geocod\w*)\b|->|→", re.I)
#: Parameter words that name no subject ("amount", "limit", "Number of stories"): they vote on neither side, or
#: "I have 100 USD and need the amount in EUR" read the currency tool's `amount` parameter as the wrong way
#: (issue 14 A5: convert_currency_latest 0.57 -> 0.40). Stems, as discovery_terms writes "amount number limit count
#: value id query input" (written out: stemming at import would load the stemmer with the package). Not "text":
#: it is the subject of speech-to-text, and silenced it let speech-to-text lead a text-to-speech task (0.27 -> 0.79).
GENERIC_WORDS = frozenset({"amount", "number", "limit", "count", "valu", "id", "queri", "input"})
#: A fenced code block: a `Parameters:` line inside one is an example, not the section's own (curated docs).
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)
#: The export's parameter line, `Parameters: name (type, required): description; ...` (toolgym_export.py).
_PARAMETERS = re.compile(r"^[ \t]*Parameters:(.*)$", re.M)
#: Its type annotations say nothing about the tool's subject ("string", "required").
_PARAM_TYPE = re.compile(r"\((?:string|number|integer|boolean|object|array|null)[^)]*\)", re.I)
#: ... and a parameter's "to convert to Y" names the output, not the input ("The number in radians to convert to
#: degrees": the input is radians), so it is cut up to the next parameter.
_PARAM_PURPOSE = re.compile(r"\b(?:to\s+)?(?:convert|turn|translate|transform)\b[^;]*", re.I)

Sides = tuple[frozenset[str], frozenset[str]]


def split_sides(text: str) -> tuple[list[str], list[str]] | None:
    """(the stems of what `text` starts from, of what it wants), from its first clause that says both; or None."""
    return next(iter(clause_sides(text)), None)


def task_sides(task: str) -> tuple[list[str], list[str]] | None:
    """A task's sides: its one conversion, or the union of several that are not a chain; None for a chain.

    Why: "I have WKT and need GeoJSON and also I have TopoJSON and need GeoJSON" asks two conversions to one
    format (union: have wkt, topojson; need geojson); "convert X into Y, then Y into Z" has Y on both sides,
    where no single tool's direction can be read, so the feature stays 0 (issue 14 A5).
    """
    found = clause_sides(task)
    if len(found) <= 1:
        return found[0] if found else None
    haves = [set(h) for h, _ in found]
    needs = [set(n) for _, n in found]
    if any(h & n for i, h in enumerate(haves) for j, n in enumerate(needs) if i != j):
        return None
    return sorted(set().union(*haves)), sorted(set().union(*needs))


def clause_sides(text: str) -> list[tuple[list[str], list[str]]]:
    """The (have, need) stems of each clause of `text` that states a conversion, in order."""
    found = []
    for clause in _SENTENCE_END.split(text):
        if not clause or not _CONVERSION_WORD.search(clause):
            continue
        matches = [m for m in (_HAVE_NEED.search(clause), _CONVERT_INTO.search(clause)) if m]
        for m in sorted(matches, key=lambda m: m.start()):
            have, need = terms(m.group("have")), terms(m.group("need"))
            if have and need:
                found.append((have, need))
                break
    return found


def _name_sides(title: str) -> tuple[list[str], list[str]] | None:
    """A tool name's "X to Y" (`html_to_pdf`, `radiansToDegrees`), or None."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", title).replace("_", " ").replace("-", " ")
    m = _NAME_TO.match(spaced.strip())
    if not m:
        return None
    have, need = terms(m.group("have")), terms(m.group("need"))
    return (have, need) if have and need else None


def tool_sides(title: str, text: str) -> Sides | None:
    """(input stems, output stems) of a tool section: its parameters and "X into Y" vs the rest; None if no parameters.

    Inputs: the words of its `Parameters:` line (types dropped) and the X of "X into Y" in its description or
    name. Outputs: the Y (its words are then outputs only); when neither says "into", the description's words
    that are not inputs.
    """
    text = _FENCE.sub("", text)
    m = _PARAMETERS.search(text)
    if m is None:
        return None
    description = "\n".join(line for line in text[:m.start()].splitlines() if not line.lstrip().startswith("#"))
    groups = [set(terms(_PARAM_PURPOSE.sub(" ", _PARAM_TYPE.sub(" ", p)))) for p in m.group(1).split(";")]
    params = set().union(*groups)
    inputs: set[str] = set()
    outputs: set[str] = set()
    for sides in (split_sides(description), _name_sides(title)):
        if sides:
            inputs.update(sides[0])
            outputs.update(sides[1])
    if not outputs:
        return frozenset(params | inputs), frozenset(set(terms(description)) - params - inputs)
    # The "X to Y" is the clearest statement of the direction: a parameter that mentions Y configures the output
    # (`geojson_to_kml`: "documentName: Name for the KML document"), so Y's words are outputs only and that
    # parameter's other words are no input ("document" made "starting from a KML document" half for it).
    kept = set().union(*(g for g in groups if not g & outputs))
    return frozenset(inputs | (kept - outputs)), frozenset(outputs)


def direction(task_sides: tuple[list[str], list[str]] | None, node_sides: Sides | None,
              weight: Callable[[str], float]) -> float:
    """How the task's have/need sides line up with the tool's input/output sides, -1..1 (0: no evidence either way).

    Each side's matched words vote by IDF weight: a have word among the tool's inputs only (a need word among its
    outputs only) for, the other way round against, a word on both sides of the tool or a GENERIC_WORDS one
    not at all; the side's value is the votes over the weight of the words that voted, and the feature is the
    mean of the two sides when both voted the same way, else 0. Why only the matched words: a task rarely
    uses the tool's own words ("latitude" vs "geographic coordinates"); what it shares with the tool should
    count in full. Why both sides: one side is half a conversion ("convert WKT into SVG" and wkt_to_geojson:
    the input matches, SVG is given by no tool). Reverse geocoding (parameters latitude, longitude; gives an
    address) for "have a street address, need its latitude and longitude": -1; geocoding (gives "geographic
    coordinates"): 0.
    """
    if task_sides is None or node_sides is None:
        return 0.0
    (have, need), (inputs, outputs) = task_sides, node_sides
    have_vote, need_vote = _vote(have, inputs, outputs, weight), _vote(need, outputs, inputs, weight)
    if have_vote * need_vote <= 0:
        return 0.0
    return 0.5 * (have_vote + need_vote)


def _vote(side: Iterable[str], right: frozenset[str], wrong: frozenset[str], weight: Callable[[str], float]) -> float:
    """(weight of `side`'s words only in `right` - only in `wrong`) / weight of those in either; 0 if none is."""
    words = {t for t in side if (t in right) != (t in wrong) and t not in GENERIC_WORDS}
    total = sum(weight(t) for t in words)
    if total <= 0:
        return 0.0
    return sum(weight(t) if t in right else -weight(t) for t in words) / total
