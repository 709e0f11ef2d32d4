"""The ToolGym catalog benchmark on a 15-server slice: export, ingest with `kb add-folder`, evaluate.

The slice (tests/fixtures/toolgym: 15 servers exported by benchmarks/toolgym_export.py, 6 tasks of
benchmarks/toolgym_tasks.jsonl with their correct tools restricted to these servers, 2 no-match) runs
through the benchmark's own code on a real embedded store and the packaged MiniLM model. Asserts are
about logic (mapping, fields, a task whose tools carry a unique keyword is found), never scores.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SLICE = Path(__file__).parent / "fixtures" / "toolgym"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


toolgym = _load("toolgym")
export = _load("toolgym_export")


def _sections(markdown: str) -> list[str]:
    return [line[3:] for line in markdown.splitlines() if line.startswith("## ")]


def test_export_keeps_one_section_per_tool_whatever_the_descriptions_hold():
    """Headings, fences, rules and control characters inside descriptions must not add or hide sections."""
    server = {
        "qualifiedName": "@odd/server", "displayName": "Odd: \"quoted\" server\x07",
        "description": "## About Odd ### Features - many",
        "tools": [
            {"name": "first", "description": "# Title\n## Usage\n```json\n{\"a\": 1}\n## not a header\n",
             "inputSchema": {"type": "object", "required": ["q"],
                             "properties": {"q": {"type": "string", "description": "the query\nover lines"}}}},
            {"name": "second", "description": None, "inputSchema": None},
            {"name": "third", "description": "根据地址获取天气信息\n---\nSetext?\n===", "inputSchema": {}},
        ],
    }
    md = export.render_server(server)
    assert _sections(md) == ["first", "second", "third"]
    front = yaml.safe_load(md.split("---\n")[1])
    assert front["keywords"] == ["@odd/server"] and front["description"] == "## About Odd ### Features - many"
    assert "\x07" not in md and "```" not in md
    assert "(no description)" in md and "根据地址获取天气信息" in md
    assert "q (string, required): the query over lines" in md
    assert export.render_server(server) == md  # deterministic


def test_ece_and_dedupe_logic():
    assert toolgym.ece([(0.9, True), (0.9, True), (0.1, False)]) == pytest.approx(0.1)  # 2/3 x 0.1 + 1/3 x 0.1
    assert toolgym.ece([(1.0, False), (1.0, False)]) == 1.0
    assert toolgym.ece([]) is None
    a, b = ("s", "a"), ("s", "b")
    assert toolgym.dedupe([(a, 0.9), (a, 0.8), (b, 0.7), (("s", None), 0.6), (("s", None), 0.5)]) == \
        [(a, 0.9), (b, 0.7), (("s", None), 0.6), (("s", None), 0.5)]


def test_catalog_maps_hits_back_to_server_and_tool():
    catalog = toolgym.Catalog.load(SLICE / "catalog")
    assert catalog.pair("catalog/benbonn_utapimcp.md#track-shipment", "track-shipment") == \
        ("@benbonn/utapimcp", "track-shipment")
    assert catalog.pair("benbonn_utapimcp.md", "Some Server Title")[1] is None  # the server's root node
    assert catalog.pair("elsewhere.md", "x") is None
    assert len(catalog.sections()) == sum(len(v["tools"]) for v in catalog.manifest.values())


@pytest.mark.slow
def test_slice_ingests_and_the_harness_reports_every_field(tmp_path):
    """Real store, real model, the real `kb add-folder`: hit@k and no-match fields for dev, test and all."""
    from research_agent.container import build_container

    store = tmp_path / "store"
    first = toolgym.ensure_ingested(SLICE / "catalog", store)
    report = first["report"]
    assert report["added"] == 15 and not report["failed"] and not report["skipped"] and not report["warnings"]
    assert toolgym.ensure_ingested(SLICE / "catalog", store)["digest"] == first["digest"]  # reused, not redone
    catalog = toolgym.Catalog.load(SLICE / "catalog")
    tasks = toolgym.load_tasks(SLICE / "tasks.jsonl")
    c = build_container(store=str(store))
    try:
        result = toolgym.evaluate(c, catalog, tasks)
    finally:
        c.close()

    summary = result["summary"]
    assert set(summary) == {"dev", "test", "all"}
    for split in summary.values():
        for method, row in split.items():
            for k in ("hit@1", "hit@3", "hit@10"):
                assert 0.0 <= row[k] <= 1.0
            assert row["hit@1"] <= row["hit@3"] <= row["hit@10"]
            assert row["p95_ms"] >= row["p50_ms"] > 0
            if method == "bm25":
                assert row["no_match_rate"] is None
            else:
                assert 0.0 <= row["no_match_rate"] <= 1.0 and row["no_match_recs_ge_05"] >= 0
                assert row["ece"] is None or 0.0 <= row["ece"] <= 1.0
                assert 0.0 <= row["right_keep_rate"] <= row["real_keep_rate"] <= 1.0
    by_id = {m: {r["id"]: r for r in rows} for m, rows in result["rows"].items()}
    # "Hacker News" and "DHL" appear only in the correct tools' sections of this slice.
    for method in ("query", "bm25"):
        assert by_id[method]["hackernews"]["first_hit"] is not None
        assert by_id[method]["parcel"]["first_hit"] is not None
    for method in result["rows"]:
        assert by_id[method]["nm_fax"]["first_hit"] is None
    # Every answer of every method maps back to a server of the slice (none is lost in the mapping).
    servers = {v["server"] for v in catalog.manifest.values()}
    for rows in result["rows"].values():
        for row in rows:
            assert all(p is None or p[0] in servers for p in row["top"])
            assert all(p is not None for p in row["top"])


def test_fit_takes_tool_features_after_the_shared_model():
    """Issue 14, fourth round: a catalog-only feature gets its own stage, so it cannot move the shared model.

    Fitted jointly, the catalog's `tool` offset pulled the curated intercept down with it (a golden section
    0.45 -> 0.26); fitted after, on the tool rows alone, the shared coefficients are what they are without it.
    """
    import numpy as np

    from research_agent.discovery import scoring

    fit_discovery = _load("fit_discovery")
    rng = np.random.default_rng(7)
    rows = []
    for i in range(400):
        dense = float(rng.uniform(0.1, 0.8))
        is_tool = i % 2 == 0
        # Tool rows are right more often than their cosine says: the offset the second stage should find.
        p = 1 / (1 + np.exp(-(8 * (dense - 0.5) + (1.0 if is_tool else 0.0))))
        rows.append({"set": "toolgym" if is_tool else "golden", "task": i // 10, "y": int(rng.random() < p),
                     "offset": 0.0, "dense": dense, "tool": 1.0 if is_tool else 0.0})
    intercept, coef = fit_discovery.fit(rows)
    without = [{**r, "tool": 0.0} for r in rows]
    intercept0, coef0 = fit_discovery.fit(without)
    by_name, by_name0 = dict(zip(scoring.FEATURES, coef)), dict(zip(scoring.FEATURES, coef0))
    assert "tool" in scoring.TOOL_FEATURES
    assert intercept == pytest.approx(intercept0) and by_name["dense"] == pytest.approx(by_name0["dense"])
    assert by_name0["tool"] == 0.0 and by_name["tool"] > 0.2
