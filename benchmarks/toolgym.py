"""Discovery at catalog scale: which of ~10,000 MCP tools serves a task? (issue 14)

Usage:
  .venv/bin/python benchmarks/toolgym_export.py /work/.mirror/Ziqiao-git+ToolGym/repo   # Markdown catalog
  .venv/bin/python benchmarks/toolgym.py [--ingest-only] [--split dev|test|all] [--json]

The exported catalog (benchmarks/.cache/toolgym/catalog, one file per server, one `##` section per
tool) is ingested once into benchmarks/.cache/toolgym/store with `research-agent kb add-folder` (the
same path a user takes; a marker file with the catalog's digest makes later runs skip it). Then, for
each task of benchmarks/toolgym_tasks.jsonl, three rankers are asked for 10 answers:

- discovery: `discovery.discover_context` (the MCP tool `discover_context`), max_results=10;
- query:     `query.query_knowledge` (the MCP tool `query_knowledge_base`), top_k=10;
- bm25:      plain BM25 (bm25s, English stop words) over the tool sections' own text.

Each answer is mapped back to (server qualified name, tool name) through its file (manifest.json
written by the exporter) and its `##` header; an answer that is a whole server (a file's root node)
maps to (server, None) and is never a hit. Reported per split: hit@1/3/10; for the no-match tasks the
answers scored >= 0.5 (per task, and the share of tasks with any); for the real tasks the share that
keep an answer >= 0.5 (right_keep: a correct one); p50/p95 latency warm (same process, model loaded,
indexes built); expected calibration error (10 equal-width bins) of the scores against "this answer is a
correct tool".
BM25 scores are unbounded, so its threshold and ECE columns are empty.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
WORK = HERE / ".cache" / "toolgym"
TASKS = HERE / "toolgym_tasks.jsonl"
COLLECTION = "toolgym"
KS = (1, 3, 10)
#: The score the issue treats as "recommended" (discovery's own cut-off is the same 0.5).
THRESHOLD = 0.5
ECE_BINS = 10
METHODS = ("discovery", "query", "bm25")

Pair = tuple[str, "str | None"]


def norm(name: str) -> str:
    """Header text as the chunker may have rewritten it (emphasis, escapes) compared loosely."""
    return re.sub(r"[^0-9a-z]+", "", name.lower())


class Catalog:
    """The exported catalog: file -> server, and each file's tools by loose name."""

    def __init__(self, catalog_dir: Path, manifest: dict[str, Any]):
        self.dir = catalog_dir
        self.manifest = manifest
        self.tools = {f: {norm(t): t for t in v["tools"]} for f, v in manifest.items()}

    @classmethod
    def load(cls, catalog_dir: Path) -> "Catalog":
        manifest_path = catalog_dir.parent / "manifest.json"
        if not manifest_path.is_file():
            raise SystemExit(f"{manifest_path} missing: run benchmarks/toolgym_export.py first")
        return cls(catalog_dir, json.loads(manifest_path.read_text(encoding="utf-8")))

    def pair(self, source_document: str, section_title: str | None) -> Pair | None:
        """(server, tool) for a hit in `source_document` under header `section_title`; None if unknown."""
        file = Path(source_document.split("#", 1)[0]).name
        entry = self.manifest.get(file)
        if entry is None:
            return None
        tool = self.tools[file].get(norm(section_title or ""))
        return entry["server"], tool

    def sections(self) -> list[tuple[Pair, str]]:
        """((server, tool), section text) for every `##` section, in file order (BM25's corpus)."""
        out = []
        for file in sorted(self.manifest):
            text = (self.dir / file).read_text(encoding="utf-8")
            parts = re.split(r"^## (.*)$", text, flags=re.M)
            for i in range(1, len(parts), 2):
                out.append(((self.manifest[file]["server"], parts[i].strip()), f"{parts[i]}\n{parts[i + 1]}"))
        return out


def load_tasks(path: Path = TASKS) -> list[dict[str, Any]]:
    tasks = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for t in tasks:
        t["relevant_set"] = {(s, tool) for s, tool in t["relevant"]}
    return tasks


# ---- ingest ------------------------------------------------------------------------------------------

def _cli(store: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("research-agent")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "research_agent"]
    return subprocess.run([*cmd, "--store", str(store), "--json", *args], capture_output=True, text=True)


def catalog_digest(catalog_dir: Path) -> str:
    """Digest of the file names and bytes: a changed export means a (incremental) re-ingest."""
    h = hashlib.sha256()
    for p in sorted(catalog_dir.glob("*.md")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def ensure_ingested(catalog_dir: Path, store: Path, collection: str = COLLECTION) -> dict[str, Any]:
    """Ingest the catalog with `kb add-folder` unless the marker says this export is already in."""
    marker = store / f".toolgym-{collection}.json"
    digest = catalog_digest(catalog_dir)
    if marker.is_file() and json.loads(marker.read_text()).get("digest") == digest:
        return json.loads(marker.read_text())
    store.mkdir(parents=True, exist_ok=True)
    _cli(store, "collections", "create", collection, "--description", "MCP tool catalog, one file per server")
    t = time.perf_counter()
    done = _cli(store, "kb", "add-folder", str(catalog_dir), "--collection", collection, "--include", "*.md")
    if done.returncode != 0:
        raise SystemExit(f"kb add-folder failed ({done.returncode}): {done.stderr[-2000:]}")
    report = {"digest": digest, "ingest_s": round(time.perf_counter() - t, 1), "report": json.loads(done.stdout)}
    marker.write_text(json.dumps(report, indent=1))
    return report


# ---- the three rankers -------------------------------------------------------------------------------

def rank_discovery(c, catalog: Catalog, task: str, collection: str) -> list[tuple[Pair | None, float]]:
    from research_agent import discovery

    res = discovery.discover_context(c, task, max_results=10, collections=[collection])
    out = []
    for r in res.recommendations:
        # A whole-file recommendation (the server's root node) has the document title as its title.
        out.append((catalog.pair(r.path, r.title), r.relevance_score))
    return out


def rank_query(c, catalog: Catalog, task: str, collection: str) -> list[tuple[Pair | None, float]]:
    from research_agent.search.service import query_knowledge

    res = query_knowledge(c, task, collections=[collection], top_k=10)
    out = []
    for hit in res.results:
        title = hit.header_path.rsplit(" > ", 1)[-1] if hit.header_path else None
        out.append((catalog.pair(hit.source_document, title), hit.relevance_score))
    return out


class BM25:
    """Plain BM25 over the tool sections (no dense part, no fusion): the floor to beat."""

    def __init__(self, catalog: Catalog):
        import bm25s

        self._bm25s = bm25s
        sections = catalog.sections()
        self.pairs = [p for p, _ in sections]
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize([text for _, text in sections], stopwords="en", show_progress=False),
                         show_progress=False)

    def __call__(self, c, catalog: Catalog, task: str, collection: str) -> list[tuple[Pair | None, float]]:
        tokens = self._bm25s.tokenize([task], stopwords="en", show_progress=False)
        docs, scores = self.index.retrieve(tokens, k=10, show_progress=False)
        return [(self.pairs[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


# ---- measures ----------------------------------------------------------------------------------------

def dedupe(ranked: list[tuple[Pair | None, float]]) -> list[tuple[Pair | None, float]]:
    """First occurrence of each (server, tool): several chunks of one tool count once."""
    seen, out = set(), []
    for pair, score in ranked:
        key = pair if pair is not None and pair[1] is not None else (id(pair), len(out))
        if key in seen:
            continue
        seen.add(key)
        out.append((pair, score))
    return out


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))]


def ece(points: list[tuple[float, bool]], bins: int = ECE_BINS) -> float | None:
    """Expected calibration error: sum over equal-width score bins of |mean score - hit rate| x share."""
    if not points:
        return None
    total, err = len(points), 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [(s, y) for s, y in points if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if inside:
            mean_score = sum(s for s, _ in inside) / len(inside)
            hit_rate = sum(y for _, y in inside) / len(inside)
            err += len(inside) / total * abs(mean_score - hit_rate)
    return round(err, 3)


def score_task(task: dict[str, Any], ranked: list[tuple[Pair | None, float]]) -> dict[str, Any]:
    """Per-task facts for one method: first correct rank, answers >= 0.5, calibration points."""
    relevant = task["relevant_set"]
    first = next((i + 1 for i, (p, _) in enumerate(ranked) if p in relevant), None)
    return {
        "first_hit": first,
        "above": sum(1 for _, s in ranked if s >= THRESHOLD),
        "right_above": any(p in relevant and s >= THRESHOLD for p, s in ranked),
        "points": [(min(max(s, 0.0), 1.0), p in relevant) for p, s in ranked],
        "top": [list(p) if p else None for p, _ in ranked[:3]],
    }


def summarize(rows: list[dict[str, Any]], bounded: bool) -> dict[str, Any]:
    """hit@k over real tasks, the threshold rates over both kinds, latency and ECE."""
    real = [r for r in rows if not r["no_match"]]
    none = [r for r in rows if r["no_match"]]
    out: dict[str, Any] = {"tasks": len(real), "no_match_tasks": len(none)}
    for k in KS:
        hits = sum(1 for r in real if r["first_hit"] and r["first_hit"] <= k)
        out[f"hit@{k}"] = round(hits / len(real), 3) if real else None
    lat = [r["ms"] for r in rows]
    out["p50_ms"], out["p95_ms"] = (round(pct(lat, 50), 1), round(pct(lat, 95), 1)) if lat else (None, None)
    if not bounded:
        out.update(no_match_recs_ge_05=None, no_match_rate=None, real_keep_rate=None, right_keep_rate=None, ece=None)
        return out
    out["no_match_recs_ge_05"] = sum(r["above"] for r in none)
    out["no_match_rate"] = round(sum(1 for r in none if r["above"]) / len(none), 3) if none else None
    out["real_keep_rate"] = round(sum(1 for r in real if r["above"]) / len(real), 3) if real else None
    # A kept answer may be the wrong tool (a reverse geocoder at 0.83 for "address -> coordinates"): the share of
    # real tasks whose answers >= 0.5 include a correct tool says whether the kept answers are worth keeping.
    out["right_keep_rate"] = round(sum(1 for r in real if r["right_above"]) / len(real), 3) if real else None
    out["ece"] = ece([pt for r in rows for pt in r["points"]])
    return out


# ---- the run -----------------------------------------------------------------------------------------

def evaluate(c, catalog: Catalog, tasks: list[dict[str, Any]], collection: str = COLLECTION,
             methods: tuple[str, ...] = METHODS) -> dict[str, Any]:
    """Run every method on every task (after one warm-up call each); per-task rows and summaries."""
    rankers: dict[str, Callable] = {"discovery": rank_discovery, "query": rank_query}
    if "bm25" in methods:
        rankers["bm25"] = BM25(catalog)
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for m in methods:
        rankers[m](c, catalog, "warm up: find a tool", collection)  # model load, index build, caches
        for task in tasks:
            t = time.perf_counter()
            ranked = dedupe(rankers[m](c, catalog, task["task"], collection))
            row = score_task(task, ranked)
            row.update(id=task["id"], split=task.get("split", "all"), no_match=bool(task["no_match"]),
                       ms=(time.perf_counter() - t) * 1000)
            rows[m].append(row)
    splits = sorted({t.get("split", "all") for t in tasks}) + ["all"]
    summary = {s: {m: summarize([r for r in rows[m] if s == "all" or r["split"] == s], m != "bm25")
                   for m in methods} for s in splits}
    return {"summary": summary, "rows": rows}


def table(summary: dict[str, Any]) -> str:
    cols = ("hit@1", "hit@3", "hit@10", "no_match_recs_ge_05", "no_match_rate", "real_keep_rate", "right_keep_rate",
            "ece", "p50_ms", "p95_ms")
    lines = []
    for split, by_method in summary.items():
        any_m = next(iter(by_method.values()))
        lines.append(f"\n[{split}] {any_m['tasks']} tasks + {any_m['no_match_tasks']} no-match")
        lines.append(f"{'method':10s}" + "".join(f"{c:>21s}" for c in cols))
        for m, row in by_method.items():
            lines.append(f"{m:10s}" + "".join(f"{'-' if row[c] is None else row[c]:>21}" for c in cols))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--catalog", type=Path, default=WORK / "catalog")
    ap.add_argument("--store", type=Path, default=WORK / "store")
    ap.add_argument("--tasks", type=Path, default=TASKS)
    ap.add_argument("--split", choices=("dev", "test", "all"), default="all")
    ap.add_argument("--ingest-only", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    args = ap.parse_args()

    catalog = Catalog.load(args.catalog)
    ingest = ensure_ingested(args.catalog, args.store)
    if args.ingest_only:
        print(json.dumps({k: v for k, v in ingest.items() if k != "report"}))
        return
    from research_agent.container import build_container

    tasks = [t for t in load_tasks(args.tasks) if args.split == "all" or t.get("split") == args.split]
    c = build_container(store=str(args.store))
    try:
        result = evaluate(c, catalog, tasks)
    finally:
        c.close()
    result["meta"] = {"tasks_file": str(args.tasks), "servers": len(catalog.manifest),
                      "tools": sum(len(v["tools"]) for v in catalog.manifest.values()),
                      "ingest_s": ingest.get("ingest_s"), "load_avg": round(os.getloadavg()[0], 2)}
    (WORK / "results.json").parent.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps(result, indent=1, default=list))
    print(json.dumps(result["summary"], indent=1) if args.json else table(result["summary"]))


if __name__ == "__main__":
    main()
