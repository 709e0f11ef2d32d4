"""Direction of a conversion and copies of one tool (issue 14, fourth round): pure logic, no store.

The real-store check is tests/test_discovery_catalog.py::test_catalog_direction_of_a_conversion_picks_the_tool
(the 15-server ToolGym slice with the packaged model); here the pieces: how a task is split into what it has
and what it needs, how a tool section is split into what it takes and what it gives, the feature, and the
feature rows the fitted model reads.
"""

from __future__ import annotations

import pytest

from conftest import make_node
from research_agent import discovery
from research_agent.discovery import ranking, scoring
from research_agent.discovery.direction import GENERIC_WORDS, direction, split_sides, task_sides, tool_sides

GEOCODE = ("## maps_geocode\n\nConvert an address into geographic coordinates\n\n"
           "Parameters: address (string, required): The address to geocode")
REVERSE = ("## maps_reverse_geocode\n\nConvert coordinates into an address\n\n"
           "Parameters: latitude (number, required): Latitude coordinate; longitude (number, required): Longitude")


@pytest.mark.parametrize("task,have,need", [
    ("I have a street address and need its latitude and longitude", {"street", "address"}, {"latitud", "longitud"}),
    ("turn a GPS lat/lon pair into the nearest street address", {"gps", "lat", "lon", "pair"},
     {"nearest", "street", "address"}),
    ("given an angle in degrees, I want its value in radians", {"angl", "degre"}, {"valu", "radian"}),
    ("I got a GeoJSON geometry and want the Well-Known Text", {"geojson", "geometri"}, {"well", "known", "text"}),
])
def test_task_sides_read_have_need_and_convert_into(task, have, need):
    sides = split_sides(task)
    assert sides is not None and set(sides[0]) == have and set(sides[1]) == need


@pytest.mark.parametrize("task", [
    "what is on the front page of Hacker News today",
    "I want to send a message to a Slack channel",      # "to" alone is no conversion
    "where is my DHL package right now, I have its tracking number",  # a have side, no need side
    "I have to fix the flaky test",                     # "have to": nothing on the have side
    # Issue 14 A5: "from <service> get <thing>" is a lookup, not a conversion (no have/need, no conversion verb).
    "from Hacker News get the best stories",
    "from a TMDB movie id get the Netflix streaming link",
    "given the subreddit name get the top posts",
])
def test_tasks_that_are_no_conversion_have_no_sides(task):
    assert split_sides(task) is None


def test_tool_sides_come_from_parameters_and_into_and_curated_text_has_none():
    assert tool_sides("maps_geocode", GEOCODE) == (frozenset({"address", "geocod"}), frozenset({"geograph", "coordin"}))
    inputs, outputs = tool_sides("maps_reverse_geocode", REVERSE)
    assert {"latitud", "longitud"} <= inputs and outputs == {"address"}
    # A name "x_to_y" / camelCase is read too; a parameter's "to convert to Y" names the output, not an input.
    inputs, outputs = tool_sides("radiansToDegrees", "Converts a radian value\n\nParameters: number (number, "
                                 "required): The number in radians to convert to degrees")
    assert "radian" in inputs and "degre" in outputs and "degre" not in inputs
    # No `Parameters:` line (a curated section, a server's intro): no sides, so the feature stays 0.
    assert tool_sides("Error handling", "## Error handling\n\nConvert exceptions into coded errors.") is None


def test_direction_is_signed_and_neutral_without_evidence():
    task = split_sides("I have a street address and need geographic coordinates")
    one = lambda _t: 1.0  # noqa: E731
    right = direction(task, tool_sides("maps_geocode", GEOCODE), one)
    wrong = direction(task, tool_sides("maps_reverse_geocode", REVERSE), one)
    assert right > 0 > wrong and -1.0 <= wrong and right <= 1.0
    assert direction(None, tool_sides("maps_geocode", GEOCODE), one) == 0.0
    assert direction(task, None, one) == 0.0


def test_fitted_model_reads_direction_against_tool_and_copies_the_right_way():
    assert set(scoring.COEF) == set(scoring.FEATURES)
    base = {"dense": 0.6, "coverage": 0.5, "kw_rr": 0.5, "kw_rel": 0.5}
    assert scoring.logit({**base, "against": 1.0}) < scoring.logit(base) < scoring.logit({**base, "direction": 1.0})
    assert scoring.logit({**base, "copies": scoring.copies(5)}) > scoring.logit(base)
    assert scoring.copies(0) == 0.0 and scoring.copies(scoring.COPIES_HALF) == 0.5


def test_a_wrong_way_tool_is_no_rival_in_the_margin():
    # The leader by cosine runs the conversion the wrong way: the right tool's gap is to the next plausible one.
    assert scoring.margins([0.69, 0.62, 0.36], rivals=[False, True, True]) == pytest.approx([0.07, 0.26, -0.26])


def _scored(nodes, key_word):
    ix = discovery.NodeIndex("k", nodes, list(nodes), None, None, {}, {"s.md": list(nodes)})
    return [ranking.Scored(n, ix, 0.0, 0.5, 0.3, 0.3, [], [], [], key_word=key_word[k], task_terms=["a", "b", "c"])
            for k, n in nodes.items()]


def test_feature_rows_count_copies_holding_the_key_word_and_flag_tool_sections():
    # Three servers list "send_message"; one other tool. Copies count only for nodes holding the task's rarest
    # word: "send a message to a Telegram group" must not be lifted by a dozen WhatsApp send_message copies.
    nodes = {f"s{i}": make_node(f"s{i}", document=f"s{i}.md") for i in range(3)} | {"o": make_node("o")}
    for k in ("s0", "s1", "s2"):
        nodes[k].header_path = "send_message"
    nodes["s0"].sides = (frozenset({"text"}), frozenset({"messag"}))
    rows = ranking.feature_rows(_scored(nodes, {"s0": True, "s1": True, "s2": False, "o": True}), {})
    assert [r["copies"] for r in rows] == [scoring.copies(2), scoring.copies(2), 0.0, 0.0]
    assert [r["tool"] for r in rows] == [1.0, 0.0, 0.0, 0.0]


# -- issue 14, A5's attack on the direction feature --------------------------------------------------------------
WKT = ("## wkt_to_geojson\n\nConvert Well-Known Text (WKT) into GeoJSON format\n\n"
       "Parameters: wkt (string, required): The WKT string to convert")
CURRENCY = ("## convert_currency_latest\n\nConverts an amount from one currency to another using the latest rates\n\n"
            "Parameters: amount (number, required): The amount to convert; from_currency (string, required): "
            "Source currency code; to_currency (string, required): Target currency code")


@pytest.mark.parametrize("task,node", [
    ("convert WKT into SVG", ("wkt_to_geojson", WKT)),  # the input matches, the output (SVG) nowhere
    ("I have a street address and need its latitude and longitude", ("maps_geocode", GEOCODE)),
    ("convert a street address into a ZIP+4 postal code", ("maps_geocode", GEOCODE)),
])
def test_direction_needs_evidence_on_both_sides(task, node):
    """A tool that only takes what the task has is no evidence that it gives what the task needs (A5: 0.56 -> 0.85)."""
    assert direction(task_sides(task), tool_sides(*node), lambda _t: 1.0) == 0.0


def test_wrong_way_on_both_sides_still_counts_against():
    task = task_sides("I have a street address and need its latitude and longitude")
    assert direction(task, tool_sides("maps_reverse_geocode", REVERSE), lambda _t: 1.0) == -1.0


def test_generic_parameter_words_carry_no_side():
    from research_agent.text import discovery_terms

    assert GENERIC_WORDS == set(discovery_terms("amount number limit count value id query input"))
    # "amount" is the currency tool's parameter: the need side "the amount in EUR" must not vote against it.
    task = task_sides("I have 100 USD and need the amount in EUR")
    assert task is not None and direction(task, tool_sides("convert_currency_latest", CURRENCY), lambda _t: 1.0) >= 0


@pytest.mark.parametrize("task,have,need", [
    # A need side stops at the next request; two conversions to one format are read together.
    ("convert GeoJSON into KML and then print it on a 3D printer", {"geojson"}, {"kml"}),
    ("I have WKT and need GeoJSON and also I have TopoJSON and need GeoJSON", {"wkt", "topojson"}, {"geojson"}),
    ("I have WKT and need GeoJSON; I have TopoJSON and need GeoJSON", {"wkt", "topojson"}, {"geojson"}),
])
def test_task_sides_read_each_clause_alone(task, have, need):
    sides = task_sides(task)
    assert sides is not None and set(sides[0]) == have and set(sides[1]) == need


def test_a_chain_of_conversions_has_no_direction():
    # KML is the need of the first clause and the have of the second: no one tool's direction fits the task.
    assert task_sides("convert GeoJSON into KML, then convert KML into a shapefile") is None


def test_parameters_line_inside_a_code_fence_is_no_tool():
    text = ("## Calling a tool\n\nConvert the request into a call like this:\n\n```text\n"
            "Parameters: address (string, required): The address\n```\n\nThen read the reply.")
    assert tool_sides("Calling a tool", text) is None
    assert tool_sides("Calling a tool", text.replace("```text\n", "").replace("\n```", "")) is not None
