"""Ingest benchmark: a folder of generated Markdown files, first ingest vs pure encode time, re-ingest, RSS.

Usage: .venv/bin/python benchmarks/ingest.py [--files 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from research_agent import ingest
    from research_agent.catalog import collections
    from research_agent.container import build_container

    work = Path(tempfile.mkdtemp(prefix="ra-bench-ingest-"))
    corpus = work / "corpus"
    make_corpus(corpus, args.files)
    c = build_container(store=str(work / "store"))
    collections.create_collection(c, "bench")
    c.embedder.embed_query("warm up")  # model load is not ingest time

    t = time.perf_counter()
    first = ingest.ingest_path(c, corpus, "bench", recursive=True)
    first_s = time.perf_counter() - t

    # Pure encode time of exactly the chunks just written, same process, same batch size.
    from research_agent.ingest import embedding_text, prepare_file, source_name

    texts = []
    for f in sorted(corpus.rglob("*.md")):
        doc = prepare_file(c, f, source_name(f, corpus))
        texts += [
            embedding_text({"document_title": doc.title, "header_path": ch.header_path}, ch.text) for ch in doc.chunks
        ]
    t = time.perf_counter()
    for start in range(0, len(texts), 256):
        c.embedder.embed_documents(texts[start:start + 256])
    encode_s = time.perf_counter() - t

    t = time.perf_counter()
    again = ingest.ingest_path(c, corpus, "bench", recursive=True)
    reingest_s = time.perf_counter() - t
    assert again.unchanged == args.files and again.chunks_written == 0

    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"files": args.files, "chunks": first.chunks_written, "ingest_s": round(first_s, 2),
           "encode_s": round(encode_s, 2), "ingest_over_encode": round(first_s / encode_s, 3),
           "reingest_s": round(reingest_s, 3), "reingest_speedup": round(first_s / reingest_s, 1),
           "peak_rss_mb": round(rss_mb)}
    if args.json:
        print(json.dumps(row))
    else:
        for k, v in row.items():
            print(f"{k:>20}: {v}")


if __name__ == "__main__":
    main()
