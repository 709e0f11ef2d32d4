"""Code search: today's blank-line split against syntax-tree chunks (issue 17, research_agent/ingest/code_chunks.py).

Usage: nice .venv/bin/python benchmarks/code_search.py [--packages requests,click] [--limit N] [--json]

Set: the Python source of public libraries installed in the venv (default `requests` and `click`). Each
function or method with a docstring is one query: the docstring's first sentence (at least 4 words).
No answer leaks: the indexed copy of every file has ALL docstrings (module, class, function) blanked, their
first line replaced by `...` at the same indentation (valid Python, same line numbers), so a query's words are
nowhere in the index except as identifiers and comments. Relevant: the function's lines in its file (from the
decorator to the last line, Python's own `ast`, so tree-sitter does not judge itself).

Chunks: both chunkers run as ingest runs them, with the packaged all-MiniLM-L6-v2's tokenizer and limit
(chunk_max_tokens 350, bounded by the model's 256 word pieces less the title/path line): `regex` is
chunking.chunk_document with code_chunks switched off (Chunker.code's blank-line split), `tree` is code_chunks
with the chunker's own per-path budget, and `tree-no-context` the same without the class/function signature
lines repeated before split pieces (code_chunks.REPEAT_CONTEXT off). Each chunk is embedded as ingest embeds
it (prepare.embedding_text: title and header path line, then the text); the search is an exact cosine scan
over all chunks of the set (the store's dense search without the store; no keyword index, no reranker).

Metrics per chunker: hit@1, hit@5 and MRR@10 where a chunk is relevant when its line range overlaps the
function's (`overlap`), and again when it also holds the function's `def` line (`def`, stricter: the hit
shows the function's signature); chunk count and mean tokens per chunk.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHUNK_MAX_TOKENS = 350  # config.py's default chunk_max_tokens
MIN_QUERY_WORDS = 4


@dataclass
class Query:
    text: str
    file: str
    start: int  # 1-based, decorator included
    end: int
    def_line: int


def blank_docstrings(source: str) -> tuple[str, list[Query]]:
    """(the file with every docstring blanked, one query per documented function)."""
    tree = ast.parse(source)
    lines = source.split("\n")
    queries: list[Query] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            continue
        doc = body[0]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sentence = first_sentence(body[0].value.value)
            if len(sentence.split()) >= MIN_QUERY_WORDS:
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                queries.append(Query(sentence, "", start, node.end_lineno or node.lineno, node.lineno))
        indent = lines[doc.lineno - 1][:doc.col_offset]
        for n in range(doc.lineno, (doc.end_lineno or doc.lineno) + 1):
            lines[n - 1] = ""
        lines[doc.lineno - 1] = indent + "..."
    return "\n".join(lines), queries


def first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0].strip()


def corpus(packages: list[str]) -> tuple[dict[str, str], list[Query]]:
    files: dict[str, str] = {}
    queries: list[Query] = []
    for package in packages:
        root = Path(importlib.import_module(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            name = f"{package}/{path.relative_to(root)}"
            try:
                text, found = blank_docstrings(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            files[name] = text
            for q in found:
                q.file = name
                queries.append(q)
    return files, queries


def regex_chunks(name: str, text: str, limits: dict) -> list[tuple[str, str, int, int]]:
    """Chunker.code's blank-line split as ingest runs it (code_chunks switched off when the hook is in)."""
    from research_agent.ingest import code_chunks as cc
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import parse_text

    with mock.patch.object(cc, "code_chunks", lambda *a, **k: None):
        chunks = chunk_document(parse_text(text, format="code", name=name), source=name, title=Path(name).stem,
                                **limits)
    return [(c.header_path, c.text, c.line_start or 0, c.line_end or 0) for c in chunks]


def tree_chunks(name: str, text: str, limits: dict) -> list[tuple[str, str, int, int]]:
    """code_chunks with the chunker's per-path budget (what Chunker.code_by_tree passes)."""
    from research_agent.ingest.chunking import MAX_CHUNK_BYTES, _Chunker, cap_header_path
    from research_agent.ingest.code_chunks import code_chunks, module_name

    chunker = _Chunker(name, limits["max_tokens"], 0, count=limits["count_tokens"],
                       model_max=limits["model_max_tokens"], title=Path(name).stem, max_bytes=MAX_CHUNK_BYTES)
    pieces = code_chunks(text, "python", lambda path: chunker.budget(cap_header_path(path)), chunker.sizes,
                         module=module_name(name))
    if pieces is None:
        return regex_chunks(name, text, limits)
    return [(cap_header_path(p.symbol_path), p.text, p.line_start, p.line_end) for p in pieces]


def bare_tree_chunks(name: str, text: str, limits: dict) -> list[tuple[str, str, int, int]]:
    """Tree chunks without the class/function signature lines repeated before split pieces."""
    from research_agent.ingest import code_chunks as cc

    with mock.patch.object(cc, "REPEAT_CONTEXT", False):
        return tree_chunks(name, text, limits)


def evaluate(rows: list[tuple[str, str, int, int, str]], queries: list[Query], embedder, qvecs) -> dict:
    import numpy as np

    from research_agent.ingest.prepare import embedding_text

    texts = [embedding_text({"document_title": Path(f).stem, "header_path": hp}, t) for hp, t, _, _, f in rows]
    started = time.perf_counter()
    vecs = np.asarray(embedder.embed_documents(texts), dtype=np.float32)
    embed_s = time.perf_counter() - started
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True) + 1e-12
    scores = qvecs @ vecs.T
    out = {"chunks": len(rows), "mean_tokens": float(np.mean(embedder.count_tokens([r[1] for r in rows]))),
           "embed_s": round(embed_s, 1)}
    for rule in ("overlap", "def"):
        ranks = []
        for qi, q in enumerate(queries):
            order = np.argsort(-scores[qi])[:10]
            rank = next((r + 1 for r, ci in enumerate(order) if relevant(rows[ci], q, rule)), None)
            ranks.append(rank)
        out[rule] = {"hit@1": sum(r == 1 for r in ranks if r) / len(ranks),
                     "hit@5": sum(1 for r in ranks if r and r <= 5) / len(ranks),
                     "mrr@10": sum(1 / r for r in ranks if r) / len(ranks)}
    return out


def relevant(row: tuple[str, str, int, int, str], q: Query, rule: str) -> bool:
    _, _, start, end, file = row
    if file != q.file or end < q.start or start > q.end:
        return False
    return rule == "overlap" or start <= q.def_line <= end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", default="requests,click")
    parser.add_argument("--limit", type=int, default=0, help="at most this many queries (0: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import numpy as np

    from research_agent.container import build_container
    from research_agent.embeddings import chunk_limits

    packages = args.packages.split(",")
    files, queries = corpus(packages)
    if args.limit:
        queries = queries[:args.limit]
    embedder = build_container().embedder
    limits = chunk_limits(embedder, CHUNK_MAX_TOKENS)
    qvecs = np.asarray([embedder.embed_query(q.text) for q in queries], dtype=np.float32)
    qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True) + 1e-12
    results = {}
    for label, make in (("regex", regex_chunks), ("tree", tree_chunks), ("tree-no-context", bare_tree_chunks)):
        started = time.perf_counter()
        rows = [(*chunk, name) for name, text in files.items() for chunk in make(name, text, limits)]
        chunk_s = time.perf_counter() - started
        results[label] = {**evaluate(rows, queries, embedder, qvecs), "chunk_s": round(chunk_s, 1)}
    versions = {p: importlib.metadata.version(p) for p in packages}
    if args.json:
        print(json.dumps({"packages": versions, "files": len(files), "queries": len(queries), **results}, indent=1))
        return
    print(f"Code search on {', '.join(f'{p} {v}' for p, v in versions.items())}: {len(files)} files, "
          f"{len(queries)} queries (docstring first sentences, docstrings blanked in the index)")
    print("| chunker | chunks | mean tokens | hit@1 overlap | hit@5 overlap | MRR@10 overlap | hit@1 def | "
          "hit@5 def | MRR@10 def | chunking s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        o, d = r["overlap"], r["def"]
        print(f"| {label} | {r['chunks']} | {r['mean_tokens']:.0f} | {o['hit@1']:.3f} | {o['hit@5']:.3f} | "
              f"{o['mrr@10']:.3f} | {d['hit@1']:.3f} | {d['hit@5']:.3f} | {d['mrr@10']:.3f} | {r['chunk_s']} |")


if __name__ == "__main__":
    main()
