"""Discovery's text analysis runs in time linear in its input: no regex backtracks over a whole note.

Regression (outside MCP tester, commit 02b7f3e): `first_sentence` searched `(.{20,}?[.!?])(\\s|$)` over the
whole note; on text without sentence punctuation every start position scanned to the end, so a 40 KB note
took 17.8 s and 80 KB 57 s, and one 60 KB unpunctuated note stalled list_knowledge_bases,
research://knowledge, retrieve_knowledge, check_store and /health. `to_plain` (retrieve_knowledge's plain
format) had the same shape in three of its rules: single-star emphasis, links and HTML comments.

Each call runs in a real subprocess with a deadline, so the old code fails the test instead of hanging it;
the 2 s bound is a hang guard, not a benchmark (linear code takes about 0.01 s here).
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent.discovery.analysis import first_sentence, to_plain

ROOT = Path(__file__).resolve().parents[1]
#: 200 KB: 2.5 times the 80 KB note that took 57 s on the old code.
SIZE = 200_000
HANG_GUARD_S = 2.0


def _elapsed(function: str, text_expr: str) -> float:
    """Seconds one call of research_agent.discovery.analysis.<function>(<text_expr>) takes in a fresh
    interpreter; fails the test when the subprocess runs past 60 s (a regex stuck in C cannot be interrupted
    in-process)."""
    code = (f"import time\nfrom research_agent.discovery.analysis import {function} as f\nN = {SIZE}\n"
            f"text = {text_expr}\nt = time.perf_counter()\nf(text)\nprint(time.perf_counter() - t)")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                             check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{function}({text_expr}) ran past 60 s")
    return float(out.stdout.strip())


def test_first_sentence_of_200kb_unpunctuated_text_finishes():
    assert _elapsed("first_sentence", "'word ' * (N // 5)") < HANG_GUARD_S


@pytest.mark.parametrize("text_expr", [
    "' *a' * (N // 3)",      # single-star openers that never close
    "'[' * N",               # link openers that never close
    "'[a](' * (N // 4)",     # link targets that never close
    "'<!--' * (N // 4)",     # HTML comments that never close
    "'**x ' * (N // 4)",
    "'`a' * (N // 2)",
])
def test_to_plain_of_200kb_adversarial_markup_finishes(text_expr):
    assert _elapsed("to_plain", text_expr) < HANG_GUARD_S


def _old_first_sentence(text: str) -> str:
    """The old implementation, the reference for what the first sentence is (fine on short text)."""
    lines = text.split("\n")
    if lines and lines[0].lstrip().startswith("#"):
        lines = lines[1:]
    body = " ".join(line.strip() for line in lines if line.strip() and not line.strip().startswith(("```", "|")))
    m = re.search(r"(.{20,}?[.!?])(\s|$)", body)
    return (m.group(1) if m else body)[:240]


def test_first_sentence_is_unchanged_on_ordinary_text():
    """The bounded scan gives the old answer: 2,000 random texts of words, punctuation and line breaks,
    some with the sentence end near the 240-character cut."""
    rng = random.Random(7)
    pieces = ["word", "x", "a.b", ".", "!", "?", " ", " ", "\n", "# Title\n", "```", "| a |", "e.g.", "end. "]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 160)))
        assert first_sentence(text) == _old_first_sentence(text), text
    long = "Intro " + "x" * 233 + ". Next sentence."
    assert first_sentence(long) == _old_first_sentence(long)


def test_first_sentence_examples():
    assert first_sentence("# Title\nThe store keeps every chunk. It never forgets.") == "The store keeps every chunk."
    assert first_sentence("short. " + "w " * 300) == ("short. " + "w " * 300)[:240]


#: What to_plain made of ordinary markdown before the linear rules; the rules must keep it.
@pytest.mark.parametrize(("markdown", "plain"), [
    ("# Head\nSome **bold** and *italic* and __strong__ text.", "Head\nSome bold and italic and strong text."),
    ("See [the docs](https://x.org/a_(b)) and ![img](p.png).", "See the docs) and img."),
    ("See [the docs](https://x.org \"T\") now.", "See the docs now."),
    ("a <!-- hidden --> b <!-- also\nhidden --> c", "a  b  c"),
    ("left <!-- open", "left <!-- open"),
    ("2 * 3 * 4 and *a*", "2 * 3 * 4 and a"),
    ("`code` and ```\nfence\n```", "code and ```\nfence"),
])
def test_to_plain_examples(markdown, plain):
    assert to_plain(markdown) == plain
