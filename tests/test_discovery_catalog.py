"""Discovery over a tool catalog (issue 14): the calibrated score, abstention, and tools over their server.

Logic tests on hand-built candidates, then one real store: the 15-server ToolGym slice
(tests/fixtures/toolgym, exported by benchmarks/toolgym_export.py) ingested with the packaged MiniLM model.
Asserts are about behaviour (who is listed, on which side of 0.5, what kind of node), never exact scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_node
from research_agent import discovery, ingest
from research_agent.catalog import collections
from research_agent.discovery import ranking, scoring

SLICE = Path(__file__).parent / "fixtures" / "toolgym"


_node = make_node


def _scored(nodes, evidence):
    ix = discovery.NodeIndex("k", nodes, list(nodes), None, None, {}, {"s.md": list(nodes)})
    return [ranking.Scored(nodes[k], ix, 0.0, d, cov, cov, [], [], []) for k, (d, cov) in evidence.items()]


# -- logic -----------------------------------------------------------------------------------------------
def test_fitted_model_covers_every_feature_and_moves_the_right_way():
    assert set(scoring.COEF) == set(scoring.FEATURES)
    base = {"dense": 0.4, "dense_margin": 0.0, "coverage": 0.3, "title_coverage": 0.1, "kw_rr": 0.5,
            "kw_rel": 0.5, "parent": 0.0, "key_word": 0.0}
    # More cosine, a lead over the other candidates, more of the task's words, a better keyword rank:
    # each raises the probability; being a parent (an intro over sub-sections) lowers it.
    for feature, more in (("dense", 0.6), ("dense_margin", 0.2), ("coverage", 0.8), ("kw_rr", 1.0), ("key_word", 1.0)):
        assert scoring.logit({**base, feature: more}) > scoring.logit(base), feature
    assert scoring.logit({**base, "parent": 1.0}) < scoring.logit(base)
    # Issue 14: a task of one or two content words, and a node holding hundreds of distinct words, lower it.
    assert scoring.logit({**base, "thin_task": scoring.thin_task(1)}) < scoring.logit(base)
    wide, narrow = {**base, "breadth": scoring.breadth(1500)}, {**base, "breadth": scoring.breadth(20)}
    assert scoring.logit(wide) < scoring.logit(narrow)
    assert 0.0 < scoring.sigmoid(-1e9) < 1e-20 and scoring.sigmoid(1e9) == 1.0  # clipped, no overflow


def test_margins_are_the_gap_to_the_best_other_candidate():
    assert scoring.margins([0.5, 0.7, 0.6]) == pytest.approx([-0.2, 0.1, -0.1])
    assert scoring.margins([0.3]) == pytest.approx([0.3])
    assert scoring.margins([]) == []
    # Copies of one tool (one group) are not rivals: the leader's gap is to the best candidate of another group.
    assert scoring.margins([0.7, 0.69, 0.5], ["t", "t", "u"]) == pytest.approx([0.2, 0.19, -0.2])


def test_calibrate_reads_keyword_rank_relative_bm25_and_boosts_as_odds():
    nodes = {"a": _node("a"), "b": _node("b"), "c": _node("c")}
    scored = _scored(nodes, {"a": (0.6, 0.5), "b": (0.6, 0.5), "c": (0.2, 0.0)})
    scored[1].factors = [("status deprecated", 0.25)]
    ranking.calibrate(scored, {("k", "a"): (1, 12.0), ("k", "b"): (2, 6.0)})
    a, b, c = scored
    assert a.features["kw_rr"] == 1.0 and b.features["kw_rr"] == 0.5 and c.features["kw_rr"] == 0.0
    assert a.features["kw_rel"] == 1.0 and b.features["kw_rel"] == 0.5  # scale-free: BM25 over the task's best
    # The boost multiplies the odds: b's odds are a quarter of what its evidence alone gives.
    alone = scoring.sigmoid(scoring.logit(b.features))
    assert b.score / (1 - b.score) == pytest.approx(0.25 * alone / (1 - alone))
    assert a.score > b.score > c.score and all(0.0 < s.score < 1.0 for s in scored)


def test_runners_up_are_listed_as_skip_and_the_message_abstains():
    nodes = {k: _node(k) for k in "abcd"}
    scored = _scored(nodes, {k: (0.3, 0.0) for k in nodes})
    for s, p in zip(scored, (0.4, 0.2, 0.06, 0.01)):
        s.score = p
    ranked, listed = ranking.rank(scored, 0.5, 3000)
    assert [s.node.id for s in listed] == ["a", "b", "c"]  # 0.01 is under LIST_FLOOR
    recs = ranking.recommendations(listed, [scored[0].index], 5)
    assert [r.priority for r in recs] == ["skip"] * 3
    msg = ranking.message(recs, ranked, 0.5)
    assert msg.startswith("No knowledge relevant") and "listed with priority 'skip'" in msg
    scored[0].score = 0.8
    recs = ranking.recommendations(ranking.rank(scored, 0.5, 3000)[1], [scored[0].index], 5)
    msg = ranking.message(recs, ranked, 0.5)
    assert "1 should load" in msg and "2 less likely" in msg


def _message_for(scores: list[float]) -> str:
    nodes = {k: _node(k, tokens=60) for k in "abcd"[:len(scores)]}
    scored = _scored(nodes, {k: (0.3, 0.0) for k in nodes})
    for s, p in zip(scored, scores):
        s.score = p
    ranked, listed = ranking.rank(scored, 0.5, 3000)
    return ranking.message(ranking.recommendations(listed, [scored[0].index], 5), ranked, 0.5)


def test_message_advice_is_true_to_the_bands_listed():
    """Only 'consider' items (none >= 0.7): the advice names them and their tokens, not "0.7 or more (0 tokens)"."""
    msg = _message_for([0.62, 0.55, 0.2])
    assert "2 to consider" in msg and "1 less likely" in msg, msg
    assert "ids scoring 0.7 or more" not in msg and "about 0 tokens" not in msg, msg
    assert "about 120 tokens" in msg, msg  # the two consider items, 60 tokens each
    # With items at 0.7 or more the advice is to load those, and counts only their tokens.
    msg = _message_for([0.95, 0.75, 0.6])
    assert "0.7 or more (about 120 tokens)" in msg and "1 to consider" in msg, msg
    assert "include_children" not in msg  # no item is marked include_children here


def test_tool_sections_never_collapse_into_their_server():
    """Issue 14, fifth round: a 3-tool PlantUML server (encode, decode, generate) was recommended whole (0.90) for
    "I have an encoded PlantUML string ... need the plain diagram source back": decode (0.90) and encode (0.83)
    each matched a task word the other did not, 2 of 3 children, so the server stood for both and the decoder
    left the list. Tools are alternatives to call, not parts to read together: they stay themselves. The same
    tree of curated sections (no `Parameters:` line) still collapses."""
    def tree(tools: bool):
        nodes = {"p": make_node("p", children=["x", "y", "z"], tokens=10, document="d.md"),
                 **{k: make_node(k, "p", document="d.md") for k in "xyz"}}
        if tools:
            for k in "xyz":
                nodes[k].sides = (frozenset({f"in_{k}"}), frozenset({f"out_{k}"}))
        ix = discovery.NodeIndex("k", nodes, list(nodes), None, None, {}, {"d.md": list(nodes)})
        scores = {"p": 0.15, "x": 0.9, "y": 0.83, "z": 0.49}
        return [ranking.Scored(nodes[k], ix, s, 0.73, 0.5, 0.3, [], [k], []) for k, s in scores.items()]

    ranked, listed = ranking.rank(tree(tools=True), 0.5, 3000)
    assert [s.node.id for s in listed[:2]] == ["x", "y"] and not any(s.include_children for s in ranked)
    ranked, _ = ranking.rank(tree(tools=False), 0.5, 3000)
    assert ranked[0].node.id == "p" and ranked[0].include_children


@pytest.mark.slow
def test_catalog_decoder_is_listed_not_its_three_tool_server(tmp_path):
    """The same on the real server file and model: the old code answered the whole PlantUML server (0.88,
    include_children) and nothing else; the decoder is the first answer now, a tool, not the server."""
    from conftest import isolated_container

    with isolated_container(tmp_path) as c:
        collections.create_collection(c, "tools")
        report = ingest.ingest_path(c, SLICE.parent / "toolgym_plantuml", "tools", include=["infobip_*.md"])
        assert report.added == 1 and not report.failed
        res = discovery.discover_context(c, "I have an encoded PlantUML string copied from a diagram URL and need "
                                            "the plain diagram source back", max_results=10, collections=["tools"])
    top = res.recommendations[0]
    assert top.title == "decode_plantuml" and not top.include_children, [(r.title, r.relevance_score)
                                                                           for r in res.recommendations]
    assert not any(r.include_children for r in res.recommendations)


# -- a real catalog slice ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    """The 15-server slice ingested once, real packaged model; its manifest and tasks."""
    from conftest import isolated_container

    root = tmp_path_factory.mktemp("toolgym")
    with isolated_container(root) as c:
        collections.create_collection(c, "tools")
        report = ingest.ingest_path(c, SLICE / "catalog", "tools", recursive=True, include=["*.md"])
        assert report.added == 15 and not report.failed
    manifest = json.loads((SLICE / "manifest.json").read_text(encoding="utf-8"))
    tasks = [json.loads(line) for line in (SLICE / "tasks.jsonl").read_text(encoding="utf-8").splitlines() if line]
    yield c, manifest, tasks
    c.close()


def _answer(manifest, rec):
    """(server, tool) of a recommendation; tool None for a server's root node."""
    entry = manifest[Path(rec.path.split("#", 1)[0]).name]
    return entry["server"], (rec.title if rec.title in entry["tools"] else None)


@pytest.mark.slow
def test_catalog_no_match_abstains_real_tasks_keep_a_tool_not_a_server(catalog):
    c, manifest, tasks = catalog
    for task in tasks:
        res = discovery.discover_context(c, task["task"], max_results=10, collections=["tools"])
        scores = [r.relevance_score for r in res.recommendations]
        assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
        assert res.total_available == sum(1 for s in scores if s >= 0.5)
        if task["no_match"]:  # nothing in the catalog serves it: no recommendation at 0.5 or more
            assert res.total_available == 0 and "No knowledge relevant" in res.message, task["task"]
            continue
        relevant = {tuple(p) for p in task["relevant"]}
        answers = [_answer(manifest, r) for r in res.recommendations]
        assert any(a in relevant for a in answers), task["task"]
        # The first answer is a tool section, never a whole server file standing for its tools.
        assert answers[0][1] is not None and not res.recommendations[0].include_children, (task["task"], answers)
    # A task naming a thing only one tool offers (DHL tracking) keeps a recommendation at 0.5 or more; three
    # equally good tools of one server (Hacker News top/best/latest) share the probability, and the first
    # listed is one of them.
    for task in (t for t in tasks if t["id"] in ("hackernews", "parcel")):
        top = discovery.discover_context(c, task["task"], collections=["tools"]).recommendations[0]
        assert _answer(manifest, top) in {tuple(p) for p in task["relevant"]}
        assert task["id"] != "parcel" or top.relevance_score >= 0.5


# -- issue 14: action and direction words ----------------------------------------------------------------
def test_discovery_analyzer_keeps_action_words_and_drops_task_verbs():
    from research_agent import text

    assert {"creat", "new", "add", "get", "send", "updat", "chang"} <= set(
        text.discovery_terms("create a new thing, add, get, send, update, change"))
    assert text.discovery_terms("implement and write the fix, I need to make sure") == ["fix"]
    assert "revers" in text.discovery_terms("reverse geocode")


@pytest.mark.slow
@pytest.mark.parametrize("task,tool", [
    # Issue 14, fourth round: reverse geocoding (0.79 first before) takes latitude and longitude as parameters,
    # so it runs this conversion the wrong way (direction.py).
    ("I have a street address and need its latitude and longitude", "maps_geocode"),
    ("I have a latitude and longitude and need the street address", "maps_reverse_geocode"),
    ("starting from a KML document, I need the same shapes as GeoJSON", "kml_to_geojson"),
    ("I have GeoJSON shapes and want them as a KML document", "geojson_to_kml"),
])
def test_catalog_direction_of_a_conversion_picks_the_tool(catalog, task, tool):
    c, manifest, _ = catalog
    res = discovery.discover_context(c, task, max_results=10, collections=["tools"])
    answers = [_answer(manifest, r)[1] for r in res.recommendations]
    assert answers and answers[0] == tool, [(r.title, r.relevance_score) for r in res.recommendations]


# -- issue 14, A5's attack on the direction feature (tests/test_discovery_direction.py has the pieces) ---------
@pytest.mark.slow
@pytest.mark.parametrize("task", [
    # No tool of the slice serves these; the input alone matched a converter's input (direction +0.5 before).
    # Known limit: two stay over the line on words alone (no direction evidence: the need side matches nothing
    # of the tool), as they did before the direction feature (0.56, 0.45): a need that names no word of the
    # tool's output ("SVG" vs GeoJSON) cannot be told from one that names it in other words ("latitude" vs
    # "geographic coordinates", the geocoding task above).
    pytest.param("convert WKT into SVG", marks=pytest.mark.xfail(strict=True, reason="half a conversion, words")),
    "convert this CSV into an Excel spreadsheet",
    pytest.param("convert a street address into a ZIP+4 postal code",
                 marks=pytest.mark.xfail(strict=True, reason="half a conversion, words")),
    "I have a paper DOI and need the BibTeX citation",
    "translate this address into Chinese",
    "I have a KML file and need an ESRI shapefile",
])
def test_catalog_half_a_conversion_is_no_match(catalog, task):
    c, _, _ = catalog
    res = discovery.discover_context(c, task, max_results=10, collections=["tools"])
    assert all(r.relevance_score < 0.5 for r in res.recommendations), \
        [(r.title, r.relevance_score) for r in res.recommendations]


@pytest.mark.slow
@pytest.mark.parametrize("task,tool", [
    # Lookups "from <service> get <thing>" are no conversions; "amount" / "number" are no side of one.
    ("from Hacker News get the best stories", "hn_best"),
    ("from TMDB get trending movies this week", "get_trending"),
    ("I have 100 USD and need the amount in EUR", "convert_currency_latest"),
    ("I have a CIDR block and need the number of usable hosts", "calculate_subnet"),
])
def test_catalog_lookups_and_real_conversions_keep_their_tool_first(catalog, task, tool):
    """First, and still a recommendation (>= 0.5, as before the direction feature: 0.76 / 0.92 / 0.57 / 0.70)."""
    c, manifest, _ = catalog
    res = discovery.discover_context(c, task, max_results=10, collections=["tools"])
    answers = [_answer(manifest, r)[1] for r in res.recommendations]
    assert answers and answers[0] == tool and res.recommendations[0].relevance_score >= 0.5, \
        [(r.title, r.relevance_score) for r in res.recommendations]


@pytest.mark.slow
def test_catalog_two_requests_are_read_clause_by_clause(catalog):
    # The need side stopped swallowing "and also I have TopoJSON ...": geojson_to_topojson (the wrong way) led.
    c, manifest, _ = catalog
    res = discovery.discover_context(c, "I have WKT and need GeoJSON and also I have TopoJSON and need GeoJSON",
                                     max_results=10, collections=["tools"])
    answers = [_answer(manifest, r)[1] for r in res.recommendations]
    assert answers and answers[0] in {"wkt_to_geojson", "topojson_to_geojson"}, answers
