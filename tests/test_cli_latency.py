"""A CLI query opens the store in a thread while it loads its models (Container.open_store_in_background,
warm_query, wait_for_store) and the numpy cross-encoder scores its pairs on two threads (issue 12, "a CLI query
in about a second"): the same hits, order and scores as the server's path, errors coded as before, nothing
printed but the answer. Timings live in benchmarks/cli_latency.py, not here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from research_agent import embeddings, ingest, numpy_encoder, rerank
from research_agent.catalog import collections
from research_agent.search import service as query

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).parent / "research-agent")
TEXT = "how do I configure the server?"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300, cwd=Path.cwd(),
                          env={**os.environ, **(env or {})})


def _hits(result: dict) -> list[tuple[str, str, str]]:
    return [(h["source_document"], h["header_path"], h["content"]) for h in result["results"]]


@pytest.mark.slow
def test_a_reranked_cli_query_equals_the_server_path(isolated_env, docs_folder, tiny_cross_encoder, monkeypatch):
    """The CLI (new process, store opened in a thread, models warmed, two scoring threads) against a server's
    container in this process (not one-shot; float32 so it takes the same numpy model a CPU without bfloat16
    gets): same hits in the same order, scores within float noise, no torch import, stderr empty."""
    from research_agent.container import build_container

    monkeypatch.setenv("RESEARCH_AGENT_RERANKER_MODEL", str(tiny_cross_encoder))
    monkeypatch.setenv("RESEARCH_AGENT_RERANK_PRECISION", "float32")
    monkeypatch.setattr(rerank, "_cache", {})
    server = build_container()
    assert server.one_shot is False
    collections.create_collection(server, "docs")
    ingest.ingest_path(server, docs_folder, "docs", recursive=True)
    with server.store.session():
        want = query.query_knowledge(server, TEXT, collections=["docs"]).model_dump(mode="json")
    assert isinstance(server.reranker._model, numpy_encoder.NumpyCrossEncoder)
    server.close()
    assert want["reranked"] is True and len(want["results"]) >= 3

    code = ("import sys\nfrom research_agent.cli.main import app\ntry:\n"
            f"    app(['--json', 'query', {TEXT!r}, '--collections', 'docs'], prog_name='research-agent')\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            "sys.stderr.write(f\"IMPORTED {'torch' in sys.modules}\\n\")\nsys.exit(code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=Path.cwd(),
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr == "IMPORTED False\n"  # nothing else on stderr: no warning, no log line, no traceback
    got = json.loads(out.stdout)
    assert got["reranked"] is True and got["warnings"] == want["warnings"]
    assert _hits(got) == _hits(want)
    assert np.allclose([h["relevance_score"] for h in got["results"]],
                       [h["relevance_score"] for h in want["results"]], atol=1e-5)


@pytest.mark.slow
def test_store_and_model_failures_are_the_same_coded_errors(isolated_env, docs_folder, tmp_path):
    """A store that cannot open fails in the opening thread, silently; the search then raises the coded error
    as before. A reranker that cannot load leaves the query unreranked with the warning naming the cause."""
    (tmp_path / "file").write_text("not a folder")
    bad = _cli("--json", "--store", str(tmp_path / "file" / "store"), "query", "x")
    assert bad.returncode == 3 and bad.stdout == ""
    error = json.loads(bad.stderr.strip().splitlines()[-1])["error"]
    assert error["type"] == "ConfigError" and "Cannot open the store" in error["message"]
    assert "Traceback" not in bad.stderr

    assert _cli("collections", "create", "docs").returncode == 0
    assert _cli("kb", "add-folder", str(docs_folder), "--collection", "docs").returncode == 0
    broken = tmp_path / "broken-reranker"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    out = _cli("--json", "query", TEXT, "--collections", "docs", env={"RESEARCH_AGENT_RERANKER_MODEL": str(broken)})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["reranked"] is False and result["results"]
    assert any("Not reranked" in w and str(broken) in w for w in result["warnings"]), result["warnings"]
    assert "Traceback" not in out.stderr

    empty = _cli("--json", "query", "  ", "--collections", "docs")
    assert empty.returncode != 0 and json.loads(empty.stderr.strip().splitlines()[-1])["error"]["type"] == "QueryError"


def test_gelu_equals_the_erf_form():
    """_gelu (in place, one polynomial) against 0.5 x (1 + erf(x / sqrt 2)) from math.erf, across signs and scales."""
    x = np.concatenate([np.linspace(-12, 12, 4001), [0.0, -0.0, 1e-8, -1e-8, 40.0, -40.0, 3e4, -3e4]])
    x = x.astype(np.float32).reshape(-1, 1)
    want = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x[:, 0].astype(np.float64)])
    got = numpy_encoder._gelu(x.copy())
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.abs(got[:, 0] - want).max() <= 2e-6 * np.maximum(1.0, np.abs(want)).max()


def test_two_scoring_threads_give_one_threads_logits(tiny_cross_encoder, monkeypatch):
    """predict_logits on RERANK_THREADS threads (batches of ~a quarter of the pairs, the last layer on [CLS]
    only) equals one thread with one batch, pair by pair, in the order given."""
    passages = [f"Passage {i}: the server reads its settings from config.toml and port {i}. " * (1 + i % 5)
                for i in range(20)] + ["", "x"]
    model = numpy_encoder.NumpyCrossEncoder(tiny_cross_encoder, max_length=512, batch_size=32)
    monkeypatch.setattr(numpy_encoder, "RERANK_THREADS", 2)
    two = model.predict_logits(TEXT, passages)
    monkeypatch.setattr(numpy_encoder, "RERANK_THREADS", 1)
    one = model.predict_logits(TEXT, passages)
    assert len(two) == len(passages) and np.allclose(two, one, atol=1e-5)
    assert [model.predict_logits(TEXT, [p])[0] for p in passages[:3]] == pytest.approx(one[:3], abs=1e-5)


def test_the_warmed_query_vector_is_the_searched_one(isolated_env):
    """warm_query embeds the query once; the search's embed_query gets the same vector, a copy each time."""
    from research_agent.container import build_container

    c = build_container(one_shot=True)
    c.warm_query(f"  {TEXT} ", "hybrid", rerank=False)
    embedder = c.embedder
    fresh = embedder._fast.embed_query(TEXT)
    first = embedder.embed_query(TEXT)
    assert first == fresh and embedder._last_query[0] == TEXT
    first[0] = 99.0  # a caller changing its list does not change the next answer
    assert embedder.embed_query(TEXT) == fresh
    assert embeddings.loads_without_torch(c.settings)
    c.warm_query("", "keyword", rerank=False)  # nothing to warm: no error, no load
