"""research_agent.text: the three analyzers keep their own tokens and stop lists; one stemmer per thread.

The expected tokens were produced by the analyzers' previous homes (keyword.words, discovery.analysis.terms,
query._WORD) before issue 13 moved them, so a drift in any of them (which would move ranking numbers
measured with it) fails here.
"""

from __future__ import annotations

import threading

from research_agent import text

SENTENCE = "Adding the API tokens: re-index x_y in 2 files, e.g. Python's parsers_v2 and the Indexing guide."


def test_keyword_analyzer_keeps_bm25_tokens():
    # 2+ word characters (underscores and digits inside words), Lucene stop words only: "adding" stays.
    assert text.keyword_words(SENTENCE) == ["adding", "api", "tokens", "re", "index", "x_y", "files", "python",
                                            "parsers_v2", "indexing", "guide"]
    assert len(text.KEYWORD_STOP_WORDS) == 33


def test_content_analyzer_drops_task_verbs_and_stems():
    # Words start with a letter and hold letters or digits ("parsers_v2" is two words); "adding" is a task verb.
    assert text.content_terms(SENTENCE) == ["api", "token", "re", "index", "file", "python", "parser", "v2",
                                            "index", "guid"]
    assert text.content_terms("add implement write the") == []
    assert text.surface_words("Parsers parse") == {"parser": "parsers", "pars": "parse"}


def test_suggestion_analyzer_keeps_hyphens_and_case():
    assert text.suggestion_words(SENTENCE) == ["Adding", "the", "API", "tokens", "re-index", "files", "Python",
                                               "parsers", "and", "the", "Indexing", "guide"]
    assert {"shall", "etc", "see"} <= text.SUGGEST_STOP_WORDS and "adding" not in text.SUGGEST_STOP_WORDS


def test_stemmer_is_built_once_per_thread():
    here = text.stemmer()
    assert text.stemmer() is here and here.stemWord("indexing") == "index"
    other: list[object] = []
    worker = threading.Thread(target=lambda: other.append(text.stemmer()))
    worker.start()
    worker.join(timeout=60)
    # Snowball stemmers keep mutable state: a thread never shares another thread's instance.
    assert other and other[0] is not here and other[0].stemWord("indexing") == "index"


def test_snippet_window_holds_the_query_terms():
    filler = " ".join(f"word{i}" for i in range(200))
    body = f"{filler} the zebra crossing guide {filler}"
    cut = text.snippet(body, "zebra crossing", max_tokens=20)
    assert "zebra crossing" in cut and cut.startswith("… ") and cut.endswith(" …")
    assert text.snippet("short text", "zebra", max_tokens=20) == "short text"
