"""Discovery on non-Latin text, and the abstention message's honesty (outside attack on a ToolGym slice).

The keyword side of discovery must see CJK and Cyrillic words as the keyword index does (research_agent/text.py's
keyword_words): `discover "获取实时天气"` found nothing (best 0.04) while `query` found the file at rank 1.
The abstention message must state a comparison that is true ("0.50 < 0.5" was printed for 0.497), count in
the right number, and say when the collections hold no documents at all.
"""

from __future__ import annotations

import pytest

from conftest import make_node
from research_agent import discovery, ingest
from research_agent.catalog import collections
from research_agent.discovery import analysis, ranking
from research_agent.text import discovery_terms, keyword_words

FOREIGN = """---
title: "天气服务"
description: "提供全球城市的实时天气和天气预报"
---

# 天气服务

提供全球城市的实时天气和天气预报。

## 获取实时天气

根据城市名称查询当前的温度、湿度和天气状况。

Parameters: city (string, required): 城市名称

## получить_курс_валют

Возвращает текущий курс обмена валют по данным Центрального банка России.

Parameters: currency (string, required): код валюты
"""

ENGLISH = """# Geo tools

Tools for places.

## reverse_geocode

Turn a latitude and longitude into a street address.

Parameters: lat (number, required); lon (number, required)
"""


# -- logic -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["获取实时天气", "получить курс валют", "weather 北京 today"])
def test_discovery_terms_see_non_latin_words_as_the_keyword_index_does(text):
    got = set(analysis.terms(text))
    non_latin = {w for w in keyword_words(text) if not w.isascii()}
    assert non_latin and non_latin <= got, got


@pytest.mark.parametrize("text", ["create a GitHub issue and then open a pull request",
                                  "reverse geocode 52.5, 13.4 to a street address", "implement the fix"])
def test_discovery_terms_of_english_text_are_unchanged(text):
    assert analysis.terms(text) == discovery_terms(text)


def _abstain(scores: list[float]) -> str:
    nodes = {k: make_node(k) for k in "abcd"[:len(scores)]}
    ix = discovery.NodeIndex("k", nodes, list(nodes), None, None, {}, {"s.md": list(nodes)})
    scored = [ranking.Scored(nodes[k], ix, p, 0.3, 0.0, 0.0, [], [], []) for k, p in zip(nodes, scores)]
    for s, p in zip(scored, scores):
        s.score = p
    ranked, listed = ranking.rank(scored, 0.5, 3000)
    return ranking.message(ranking.recommendations(listed, [ix], 5), ranked, 0.5)


def test_abstention_message_states_a_true_comparison_in_the_right_number():
    msg = _abstain([0.497])
    assert "0.497 < 0.5" in msg and "0.50 <" not in msg, msg
    assert "The closest node is listed" in msg and "1 closest nodes" not in msg, msg
    msg = _abstain([0.4996, 0.3])  # rounds to 0.5 at three decimals: the message must not claim 0.500 < 0.5
    assert "0.499 < 0.5" in msg or "best match scored 0.5" not in msg, msg
    assert "The 2 closest nodes are listed" in _abstain([0.3, 0.2])


# -- real store, packaged model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    from conftest import isolated_container

    root = tmp_path_factory.mktemp("foreign")
    folder = root / "docs"
    folder.mkdir()
    (folder / "weather-zh.md").write_text(FOREIGN, encoding="utf-8")
    (folder / "geo.md").write_text(ENGLISH, encoding="utf-8")
    (root / "home").mkdir()
    with isolated_container(root / "home") as c:
        collections.create_collection(c, "tools")
        collections.create_collection(c, "empty")
        report = ingest.ingest_path(c, folder, "tools", include=["*.md"])
        assert report.added == 2 and not report.failed
        yield c
        c.close()


@pytest.mark.parametrize("task, title", [("获取实时天气", "获取实时天气"),
                                         ("получить курс валют", "получить_курс_валют")])
def test_discover_finds_a_non_latin_section_by_its_words(foreign, task, title):
    res = discovery.discover_context(foreign, task, max_results=3, collections=["tools"])
    assert res.recommendations and res.recommendations[0].title == title, res.recommendations
    # The keyword side matched it (the old code found no term at all, so no reason could quote one). A one-word
    # task is thin evidence (ranking.MIN_TASK_TERMS), so the score itself is not asserted.
    reason = res.recommendations[0].reason
    assert any(f"'{w}'" in reason for w in keyword_words(task)), reason


def test_discover_on_an_empty_collection_says_it_holds_no_documents(foreign):
    res = discovery.discover_context(foreign, "get the current weather in Berlin", collections=["empty"])
    assert res.recommendations == [] and res.total_available == 0
    assert res.message.startswith("No knowledge relevant"), res.message  # still reads as an abstention
    assert "collection holds no documents ('empty')" in res.message, res.message
    assert 'ingest_documents(path="PATH", collection="empty")' in res.message, res.message
    assert "best match scored" not in res.message, res.message
