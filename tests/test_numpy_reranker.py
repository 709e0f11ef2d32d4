"""The torch-free cross-encoder: the same scores and ranking as sentence-transformers' CrossEncoder for a
one-label BERT cross-encoder (built locally from the packaged MiniLM backbone, as the default
ms-marco-MiniLM-L6-v2 is shaped), reranking without a torch import in a new process, and CrossEncoder for
every model it does not reproduce."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from research_agent import ingest, numpy_encoder, rerank
from research_agent.catalog import collections
from research_agent.config import Settings
from research_agent.search import service as query

ROOT = Path(__file__).resolve().parents[1]
QUERY = "does vitamin D deficiency raise the risk of bone fractures in the elderly?"
PASSAGES = [
    "Vitamin D deficiency is associated with a higher risk of hip fractures in older adults.",
    "Calcium and vitamin D supplements reduced fractures in a trial of 3,270 elderly women.",
    "The tumor suppressor p53 regulates apoptosis in cancer cells.",
    "def fracture_risk(age, vitamin_d):\n    return 0.1 * age - 0.05 * vitamin_d",
    "| dose | fractures |\n|---|---|\n| 400 IU | 12 |\n| 800 IU | 7 |",
    "", "x", "Ünïcödé straße 東京 🙂 naïve café",
    "Bone mineral density falls with age; " * 40,  # longer than 128 tokens: truncated
    "Insulin signalling in skeletal muscle after exercise. " * 80,  # longer than 512 tokens: truncated
    "word " * 700,
    "Antibiotic resistance spreads in hospital wards.",
    "Memory T cells respond faster to a second infection.",
    "Elderly patients with low serum 25-hydroxyvitamin D fell more often.",
    "Fractures of the wrist are common in winter.",
    "Sunlight exposure raises vitamin D levels in the skin.",
    "A randomised controlled trial found no effect of vitamin D on falls.",
    "Osteoporosis treatment with bisphosphonates lowers vertebral fracture rates.",
    "The weather in Paris was mild this spring.",
    "Vitamin " * 600 + "fracture",
]


def _cross_encoder(folder: Path, max_length: int):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu", max_length=max_length, local_files_only=True)


@pytest.mark.parametrize("max_length", [128, 512])
def test_scores_and_ranking_equal_cross_encoder_predict(tiny_cross_encoder, max_length, monkeypatch):
    """Default activation (sigmoid for one label) on top of the numpy logits equals CrossEncoder.predict."""
    assert numpy_encoder.supports_cross_encoder(tiny_cross_encoder)
    # Small batches and a small attention budget, so batching and the memory cut are exercised too.
    monkeypatch.setattr(numpy_encoder, "MAX_ATTENTION_SCORES", 12 * 300 * 300)
    fast = numpy_encoder.NumpyCrossEncoder(tiny_cross_encoder, max_length=max_length, batch_size=4)
    ref = _cross_encoder(tiny_cross_encoder, max_length)
    lengths = [len(e.ids) for e in fast.tokenizer.encode_batch([(QUERY, p) for p in PASSAGES])]
    assert max(lengths) == max_length and sum(n == max_length for n in lengths) >= 3  # truncation happened
    want = ref.predict([(QUERY, p) for p in PASSAGES], show_progress_bar=False)
    got = np.asarray(rerank.normalise_scores(fast.predict_logits(QUERY, PASSAGES)))
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    assert list(np.argsort(-got, kind="stable")) == list(np.argsort(-want, kind="stable"))
    assert fast.predict_logits(QUERY, []) == []


def test_reranker_uses_numpy_for_a_local_bert_cross_encoder(tiny_cross_encoder):
    """Through the real loading code (resolve_model/load_model), with the scores rerank.py's torch path gives."""
    settings = Settings(reranker_model=str(tiny_cross_encoder))
    fast = rerank.Reranker(settings, one_shot=True)
    assert fast.load() and isinstance(fast._model, numpy_encoder.NumpyCrossEncoder)
    assert fast.precision == "float32"
    want = _cross_encoder(tiny_cross_encoder, settings.rerank_max_length).predict(
        [(QUERY, p) for p in PASSAGES[:8]], show_progress_bar=False)
    assert np.allclose(fast.score(QUERY, PASSAGES[:8]), want, atol=1e-4)


def test_reranking_in_a_new_process_does_not_import_torch(tiny_cross_encoder):
    code = ("import json, sys\nfrom research_agent.config import Settings\n"
            "from research_agent.rerank import get_reranker\n"
            f"r = get_reranker(Settings(reranker_model={str(tiny_cross_encoder)!r}), one_shot=True)\n"
            f"s = r.score({QUERY!r}, {PASSAGES[:3]!r})\n"
            "print(json.dumps([len(s), r.available, 'torch' in sys.modules,\n"
            "                  'sentence_transformers' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [3, True, False, False]


def _variant(src: Path, dest: Path, **config: object) -> Path:
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_models_it_does_not_reproduce_fall_back_to_cross_encoder(tiny_cross_encoder, tmp_path, monkeypatch):
    """Another activation or architecture, two labels, a missing file: CrossEncoder scores them, as before."""
    other = _variant(tiny_cross_encoder, tmp_path / "gelu-new", hidden_act="gelu_new")
    assert not numpy_encoder.supports_cross_encoder(other)
    assert not numpy_encoder.supports_cross_encoder(_variant(tiny_cross_encoder, tmp_path / "roberta",
                                                             model_type="roberta"))
    assert not numpy_encoder.supports_cross_encoder(_variant(tiny_cross_encoder, tmp_path / "two-labels",
                                                             id2label={"0": "no", "1": "yes"}))
    no_tokenizer = _variant(tiny_cross_encoder, tmp_path / "no-tokenizer-json")
    (no_tokenizer / "tokenizer.json").unlink()
    assert not numpy_encoder.supports_cross_encoder(no_tokenizer)
    assert not numpy_encoder.supports_cross_encoder(tmp_path / "missing")

    from sentence_transformers import CrossEncoder

    reranker = rerank.Reranker(Settings(reranker_model=str(other)))
    assert reranker.load() and isinstance(reranker._model, CrossEncoder), reranker.error
    want = _cross_encoder(other, 512).predict([(QUERY, p) for p in PASSAGES[:4]], show_progress_bar=False)
    assert np.allclose(reranker.score(QUERY, PASSAGES[:4]), want, atol=1e-2)  # bfloat16 where the CPU has it
    monkeypatch.setattr(rerank, "NUMPY_RERANKER", False)
    off = rerank.Reranker(Settings(reranker_model=str(tiny_cross_encoder)), one_shot=True)
    assert off.load() and isinstance(off._model, CrossEncoder)


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_a_long_lived_server_keeps_bfloat16_torch_where_the_cpu_computes_it(tiny_cross_encoder, monkeypatch,
                                                                            bf16_cpu):
    """The server pays torch's import once and scores 1.6-1.8x faster in bfloat16, so with precision auto on a
    bfloat16 CPU it keeps CrossEncoder; elsewhere (float32 either way) and in the CLI it takes numpy."""
    from sentence_transformers import CrossEncoder

    monkeypatch.setattr(rerank, "cpu_computes_bfloat16", lambda: bf16_cpu)
    settings = Settings(reranker_model=str(tiny_cross_encoder))
    server = rerank.Reranker(settings)
    assert server.load(), server.error
    assert isinstance(server._model, CrossEncoder if bf16_cpu else numpy_encoder.NumpyCrossEncoder)
    cli = rerank.Reranker(settings, one_shot=True)
    assert cli.load() and isinstance(cli._model, numpy_encoder.NumpyCrossEncoder)
    explicit = rerank.Reranker(Settings(reranker_model=str(tiny_cross_encoder), rerank_precision="float32"))
    assert explicit.load() and isinstance(explicit._model, numpy_encoder.NumpyCrossEncoder)


def test_the_cli_container_is_one_shot_and_the_server_container_is_not(isolated_env):
    from research_agent.cli.state import CliState
    from research_agent.container import build_container

    assert CliState().container().one_shot is True
    assert build_container().one_shot is False


@pytest.mark.slow
def test_a_reranked_cli_query_in_a_new_process_equals_the_in_process_query(container, docs_folder,
                                                                           tiny_cross_encoder, monkeypatch):
    """In process with CrossEncoder (float32) against the CLI, which reranks with numpy and imports no torch."""
    monkeypatch.setattr(rerank, "NUMPY_RERANKER", False)
    monkeypatch.setattr(rerank, "_cache", {})
    monkeypatch.setattr(container.settings, "reranker_model", str(tiny_cross_encoder))
    monkeypatch.setattr(container.settings, "rerank_precision", "float32")
    collections.create_collection(container, "docs")
    ingest.ingest_path(container, docs_folder, "docs", recursive=True)
    text = "how do I configure the server?"
    want = query.query_knowledge(container, text, collections=["docs"]).model_dump(mode="json")
    container.close()
    assert want["reranked"] is True
    code = ("import sys\nfrom research_agent.cli.main import app\ntry:\n"
            f"    app(['--json', 'query', {text!r}, '--collections', 'docs'], prog_name='research-agent')\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            "sys.stderr.write(f\"\\nIMPORTED {'torch' in sys.modules} {'sentence_transformers' in sys.modules}\\n\")\n"
            "sys.exit(code)\n")
    env_model = {"RESEARCH_AGENT_RERANKER_MODEL": str(tiny_cross_encoder)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=Path.cwd(),
                         env={**os.environ, **env_model, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == "IMPORTED False False"
    got = json.loads(out.stdout)
    assert got["reranked"] is True
    assert [h["content"] for h in got["results"]] == [h["content"] for h in want["results"]] != []
    assert np.allclose([h["relevance_score"] for h in got["results"]],
                       [h["relevance_score"] for h in want["results"]], atol=1e-4)
