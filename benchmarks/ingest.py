"""Ingest benchmark: a folder of generated Markdown files; ingest wall time against the pure encode time of
exactly the chunks it stored (same process, same model, same batches), where the time goes, and peak RSS.

Usage:
  .venv/bin/python benchmarks/ingest.py [--files 2600] [--repeats 1] [--sequential] [--json]
  .venv/bin/python benchmarks/ingest.py --rss-files 600,2600     # peak RSS of `kb add-folder` at two sizes

~3.9 chunks a file: 2,600 files are 10,010 chunks. The stage times are busy seconds summed over threads (the
overlapped pipeline runs parse, encode and write at once, so they add up to more than the wall time).
Wall and process CPU seconds are both reported, with the load as each phase starts: on a shared machine the load
can change between the ingest and the encode (10k chunks: wall ratio 0.17 with the encode at load 9-27, 2.13 with
the ingest at load 5 and the encode at 2), and then neither ratio holds (CPU seconds grow with contention too).
`--sequential` runs the one-thread path (research_agent.ingest.service.OVERLAP = False) for comparison.
The peak RSS of `kb add-folder` is each CLI process's own (os.wait4), measured in a fresh store per size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ("index chunk vector query embedding store collection project rerank header table code "
         "install configure server client token budget latency cache manifest revision lock writer "
         "reader process folder markdown section guide reference api error retry timeout").split()


def make_corpus(root: Path, files: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    for i in range(files):
        sub = root / f"area{i % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        parts = [f"---\ntitle: Document {i}\nkeywords: [{rng.choice(WORDS)}, {rng.choice(WORDS)}]\n---\n",
                 f"# Document {i}\n"]
        for s in range(rng.randint(2, 4)):
            parts.append(f"\n## Section {s} {rng.choice(WORDS)}\n\n")
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160))) + ".\n")
            if rng.random() < 0.3:
                parts.append("\n```python\nprint('example %d')\n```\n" % s)
        (sub / f"doc{i:04d}.md").write_text("".join(parts))


class Stages:
    """Busy seconds per stage, summed over threads, by wrapping the functions each stage calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[stage] += time.perf_counter() - t

        setattr(owner, name, timed)


def instrument(c: Any) -> Stages:
    from research_agent.ingest import folder, prepare, service
    from research_agent.storage import store, writer

    stages = Stages()
    stages.wrap(folder, "walk_folder", "walk")
    stages.wrap(folder, "read_regular_file", "read")
    stages.wrap(folder, "parse_bytes", "parse")
    stages.wrap(prepare, "chunk_parsed", "chunk (incl. token counts)")
    stages.wrap(c.embedder, "count_tokens", "token counts")
    stages.wrap(c.embedder, "embed_documents", "encode")
    stages.wrap(writer, "commit", "commit (Chroma + registry)")
    stages.wrap(store.Store, "registry_put", "registry writes")
    stages.wrap(service, "_versions", "ids + metadata")
    return stages


class PeakRss:
    """The largest VmRSS seen, sampled every 50 ms (ru_maxrss only ever grows, so it cannot show a phase)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRss:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


CPU_S: list[float] = []  # process CPU seconds (all threads) of each timed() call, in order


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds and result of fn(); its process CPU seconds (all threads) go to CPU_S."""
    t, cpu = time.perf_counter(), time.process_time()
    out = fn()
    CPU_S.append(time.process_time() - cpu)
    return time.perf_counter() - t, out


def stored_texts(c: Any, name: str) -> list[str]:
    """What the ingest embedded, read back from the store in ingest order (document by document)."""
    from research_agent.catalog.collections import open_collection
    from research_agent.ingest import embedding_text

    got = open_collection(c, name).get(include=["documents", "metadatas"])
    rows = sorted(zip(got["metadatas"], got["documents"]),
                  key=lambda r: (r[0]["source_document"], r[0]["chunk_sequence_id"]))
    return [embedding_text(m, t) for m, t in rows]


def encode_all(c: Any, texts: list[str]) -> None:
    """Pure encode: the same model and batches as the ingest (EMBED_BATCH_CHUNKS, in slices of 32)."""
    from research_agent.ingest import EMBED_BATCH_CHUNKS, embed_in_slices

    for start in range(0, len(texts), EMBED_BATCH_CHUNKS):
        embed_in_slices(c.embedder, texts[start:start + EMBED_BATCH_CHUNKS], lambda n: None)


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    from research_agent import ingest
    from research_agent.catalog import collections
    from research_agent.container import build_container
    from research_agent.ingest import service

    service.OVERLAP = not args.sequential
    work = Path(tempfile.mkdtemp(prefix="ra-bench-ingest-"))
    corpus = work / "corpus"
    make_corpus(corpus, args.files)
    c = build_container(store=str(work / "store"))
    c.embedder.embed_query("warm up")
    c.embedder.embed_documents(["warm up"])  # documents go through torch, loaded on first use: not ingest time
    stages = instrument(c)
    ingest_s, encode_s, rss, loads, ingest_cpu, encode_cpu = [], [], [], [], [], []
    for r in range(args.repeats):  # ingest and encode alternate, so both see the same load
        name = f"bench{r}"
        collections.create_collection(c, name)
        load = [os.getloadavg()[0]]  # 1-minute load as each phase starts and after the last: a shared machine's
        with PeakRss() as peak:  # load can change between the two phases (the ratio is only as good as it)
            seconds, first = timed(lambda: ingest.ingest_path(c, corpus, name, recursive=True))
        ingest_s.append(seconds)
        ingest_cpu.append(CPU_S[-1])
        rss.append(peak.peak)
        busy = dict(stages.seconds)
        stages.seconds.clear()
        print(f"repeat {r}: ingest {seconds:.1f} s ({CPU_S[-1]:.0f} CPU s), {first.chunks_written} chunks, "
              f"stages {dict((k, round(v, 1)) for k, v in busy.items())}", file=sys.stderr, flush=True)
        texts = stored_texts(c, name)
        assert len(texts) == first.chunks_written
        load.append(os.getloadavg()[0])
        encode_s.append(timed(lambda: encode_all(c, texts))[0])
        encode_cpu.append(CPU_S[-1])
        load.append(os.getloadavg()[0])
        loads.append([round(x, 1) for x in load])
        stages.seconds.clear()
        print(f"repeat {r}: ingest {ingest_s[-1]:.1f} s, encode {encode_s[-1]:.1f} s ({CPU_S[-1]:.0f} CPU s), "
              f"peak RSS {rss[-1]} MB, "
              f"load (ingest, encode, end) {loads[-1]}, stages {dict((k, round(v, 1)) for k, v in busy.items())}",
              file=sys.stderr, flush=True)
    again_s, again = timed(lambda: ingest.ingest_path(c, corpus, "bench0", recursive=True))
    assert again.unchanged == args.files and again.chunks_written == 0
    ingest_m, encode_m = statistics.median(ingest_s), statistics.median(encode_s)
    return {"files": args.files, "chunks": first.chunks_written, "path": "sequential" if args.sequential
            else "overlapped", "repeats": args.repeats, "ingest_s": round(ingest_m, 2), "encode_s": round(encode_m, 2),
            "ingest_over_encode": round(ingest_m / encode_m, 3),
            "ratios": [round(i / e, 3) for i, e in zip(ingest_s, encode_s)],
            "cpu_s (ingest, encode)": [[round(i), round(e)] for i, e in zip(ingest_cpu, encode_cpu)],
            "ingest_over_encode_cpu": round(statistics.median(ingest_cpu) / statistics.median(encode_cpu), 3),
            "stages_busy_s (last ingest)": {k: round(v, 2) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])},
            "reingest_s": round(again_s, 3), "peak_rss_during_ingest_mb": max(rss),
            "load_at_phases": loads, "load_average": [round(x, 2) for x in os.getloadavg()]}


def cli_rss(files: int) -> dict[str, Any]:
    """Wall time and peak RSS of one `research-agent kb add-folder` process into a fresh store."""
    work = Path(tempfile.mkdtemp(prefix="ra-bench-rss-"))
    corpus = work / "corpus"
    make_corpus(corpus, files)
    env = {**os.environ, "RESEARCH_AGENT_STORE": str(work / "store"), "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "research_agent"]
    subprocess.run([*cli, "collections", "create", "bench"], env=env, check=True, capture_output=True)
    started = time.perf_counter()
    proc = subprocess.Popen([*cli, "--json", "kb", "add-folder", str(corpus), "--collection", "bench"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    assert os.waitstatus_to_exitcode(status) == 0
    report = json.loads(out)
    return {"files": files, "chunks": report["chunks_written"], "folder_mb": round(
        sum(f.stat().st_size for f in corpus.rglob("*.md")) / 2**20, 2), "wall_s": round(wall, 1),
        "peak_rss_mb": usage.ru_maxrss // 1024, "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2600)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sequential", action="store_true")
    ap.add_argument("--rss-files", help="comma-separated folder sizes (files) for `kb add-folder` peak RSS")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = ([cli_rss(int(n)) for n in args.rss_files.split(",")] if args.rss_files else [in_process(args)])
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            for k, v in row.items():
                print(f"{k:>28}: {v}")
            print()


if __name__ == "__main__":
    main()
