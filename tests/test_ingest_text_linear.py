"""The Markdown line patterns of ingestion are linear: one hostile line (a long run of spaces or tabs, unclosed
link brackets) cannot stall an ingest. An outside tester's probe found `ingest/nodes._META_BULLET` at 18 s on
100 KB and `chunking._HEADER`, `parsing._H1` and slugify's link pattern past 20 s (lazy groups followed by
optional whitespace runs backtrack quadratically). A hang guard, not a benchmark: each case gets 2 s."""

from __future__ import annotations

import time

import pytest

from research_agent.ingest import chunking, nodes, parsing

N = 100_000
HOSTILE = {
    "header spaces": "# a" + " \t" * N + "x",
    "header hashes": "# " + "a " * N + "#" * 10 + " x",
    "bullet spaces": "- key:" + " " * N + "x",
    "bullet value spaces": "- key: a" + " \t" * N + "b",
    "h1 spaces": "# a" + " " * N + "b #",
    "link brackets": "# " + "[" * N,
    "link parens": "# " + "[a](" * (N // 4),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_one_hostile_line_is_parsed_in_linear_time(name):
    line = HOSTILE[name]
    t = time.perf_counter()
    chunking._HEADER.match(line.rstrip(" \t"))
    nodes._META_BULLET.match(line.rstrip(" \t"))
    parsing._H1.match(line.rstrip(" \t"))
    chunking.slugify(line[:50_000])
    parsing.strip_closing_hashes(line)
    assert time.perf_counter() - t < 2.0, name


def test_a_hostile_markdown_file_chunks_in_linear_time():
    from research_agent.ingest.parsing import ParsedDocument

    text = "\n".join(["# a" + " \t" * 20_000 + "x", "- key: a" + " " * 20_000 + "b", "## " + "[" * 20_000,
                      "body text"])
    t = time.perf_counter()
    chunks = chunking.chunk_document(ParsedDocument(text=text, format="markdown", title="t"), source="f.md")
    assert chunks and time.perf_counter() - t < 5.0


def test_the_patterns_still_read_ordinary_lines():
    m = chunking._HEADER.match("## Install the tool ##")
    assert (m.group(1), parsing.strip_closing_hashes(m.group(2))) == ("##", "Install the tool")
    assert parsing.strip_closing_hashes("C##") == "C##" and parsing.strip_closing_hashes("##") == "##"
    assert chunking._HEADER.match("#").group(1) == "#"
    assert chunking._HEADER.match("#hashtag") is None
    assert chunking._HEADER.match("### C# tips").group(2) == "C# tips"
    m = nodes._META_BULLET.match("- **status**: active")
    assert (m.group(1), m.group(2)) == ("status", "active")
    assert nodes._META_BULLET.match("- id:").group(2) is None
    assert parsing.strip_closing_hashes(parsing._H1.match("# Title #").group(1)) == "Title"
    assert parsing._H1.match("#  Spaced title").group(1) == "Spaced title"
    assert chunking.slugify("See [the docs](http://x) now") == chunking.slugify("See the docs now")
