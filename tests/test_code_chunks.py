"""Code chunked at syntax-tree boundaries (issue 17): research_agent/ingest/code_chunks.py.

Real parts: the tree-sitter grammar packages, the fixtures under tests/fixtures/code/ (one small real-looking
file per language), the packaged all-MiniLM-L6-v2 tokenizer for the budget test and, once, the real ingest path
into embedded Chroma. The estimate counter (chunking.estimate_counts) sizes the pure-logic cases.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from research_agent.ingest import code_chunks as cc
from research_agent.ingest.chunking import estimate_counts
from research_agent.ingest.code_chunks import CodePiece, code_chunks

CODE = Path(__file__).parent / "fixtures" / "code"
FIXTURES = {  # file -> language as parsing.CODE_LANGUAGES names it
    "inventory.py": "python", "routes.js": "javascript", "shapes.ts": "typescript", "queue.go": "go",
    "ledger.rs": "rust", "Thermostat.java": "java", "ring.c": "c", "matrix.cpp": "cpp",
}


def chunks(name: str, budget: int = 400, counter=estimate_counts) -> list[CodePiece]:
    pieces = code_chunks((CODE / name).read_text(), FIXTURES[name], budget, counter, module=name.split(".")[0])
    assert pieces is not None, name
    return pieces


def assert_exact_and_complete(text: str, pieces: list[CodePiece]) -> None:
    """Each piece's text ends with exactly the file's lines line_start..line_end (what comes before them is
    repeated signature context; a line too long for a chunk is cut into runs, each citing that line), pieces
    come in file order without overlap, and every non-blank line of the file is in one."""
    lines = text.split("\n")
    covered: set[int] = set()
    last = 0
    for piece in pieces:
        assert 1 <= piece.line_start <= piece.line_end <= len(lines), piece
        own = "\n".join(lines[piece.line_start - 1:piece.line_end])
        if piece.line_start <= last:  # only the runs of one long line share it
            assert piece.line_start == piece.line_end == last and piece.text in own, piece
        else:
            assert piece.text.endswith(own) or (piece.line_start == piece.line_end and piece.text in own), piece
        covered.update(range(piece.line_start, piece.line_end + 1))
        last = piece.line_end
    non_blank = {n for n, line in enumerate(lines, 1) if line.strip()}
    assert non_blank <= covered, sorted(non_blank - covered)


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("budget", [400, 60, 25])
def test_every_line_once_with_exact_line_ranges(name, budget):
    pieces = chunks(name, budget)
    assert_exact_and_complete((CODE / name).read_text(), pieces)
    assert max(estimate_counts([p.text for p in pieces])) <= budget


@pytest.mark.parametrize(("name", "expected"), [
    ("inventory.py", {"inventory", "inventory > Part", "inventory > Warehouse", "inventory > price_with_tax",
                      "inventory > cheapest"}),
    ("routes.js", {"routes", "routes > parseRoute", "routes > matchPath", "routes > Router"}),
    ("shapes.ts", {"shapes > Shape", "shapes > Point", "shapes > Circle", "shapes > totalArea"}),
    ("queue.go", {"queue", "queue > Queue", "queue > Queue > Push", "queue > Queue > Pop", "queue > New"}),
    ("ledger.rs", {"ledger", "ledger > Account", "ledger > Chargeable", "ledger > report", "ledger > index"}),
    ("Thermostat.java", {"Thermostat", "Thermostat > Thermostat"}),
    ("ring.c", {"ring", "ring > ring", "ring > ring_put", "ring > ring_describe"}),
    ("matrix.cpp", {"matrix", "matrix > linalg", "matrix > linalg::Matrix::multiply"}),
])
def test_symbol_paths_name_each_definition(name, expected):
    assert {p.symbol_path for p in chunks(name)} == expected


@pytest.mark.parametrize(("name", "budget", "expected"), [
    ("inventory.py", 90, {"inventory > Warehouse > restock", "inventory > Warehouse > Audit > discrepancies"}),
    ("routes.js", 60, {"routes > Router > resolve", "routes > Router > fromFile"}),
    ("ledger.rs", 30, {"ledger > Account > transfer", "ledger > report > total"}),
    ("Thermostat.java", 60, {"Thermostat > Thermostat > record", "Thermostat > Thermostat > Listener"}),
    ("matrix.cpp", 60, {"matrix > linalg > Matrix", "matrix > linalg > dot"}),
])
def test_oversized_container_split_into_members(name, budget, expected):
    """A class (impl, module, namespace) with no room in one chunk becomes one chunk per member, named
    `module > Class > method`."""
    assert expected <= {p.symbol_path for p in chunks(name, budget)}


def test_split_class_members_are_named_by_their_class_and_hold_only_their_own_lines():
    """A class too big for one chunk is split into its members; each piece's text is exactly its line range
    (kb get places it there: repeated class lines showed `class Warehouse` where the file has `def restock`,
    found by an outside tester) and its symbol path names the class for the embedding."""
    text = (CODE / "inventory.py").read_text().split("\n")
    pieces = chunks("inventory.py", 120)
    restock = next(p for p in pieces if p.symbol_path == "inventory > Warehouse > restock")
    assert restock.text.lstrip().startswith("def restock(self, sku: str, units: int) -> int:")
    assert (restock.line_start, restock.line_end) == (28, 31)
    assert restock.text == "\n".join(text[27:31])
    nested = next(p for p in chunks("inventory.py", 60)
                  if p.symbol_path == "inventory > Warehouse > Audit > discrepancies")
    assert "def discrepancies(" in nested.text and "class Warehouse" not in nested.text
    header = next(p for p in pieces if p.symbol_path == "inventory > Warehouse")
    assert header.text.startswith("class Warehouse(dict):") and 'currency = "EUR"' in header.text


def test_signatures_decorators_docstrings_and_doc_comments_stay_with_their_definition():
    py = {p.symbol_path: p for p in chunks("inventory.py")}
    tax = py["inventory > price_with_tax"].text
    assert tax.startswith("@functools.lru_cache(maxsize=256)\ndef price_with_tax(")
    assert '"""Price of a part including sales tax' in tax
    assert py["inventory > Part"].text.startswith("@dataclass\nclass Part:")
    go = {p.symbol_path: p for p in chunks("queue.go")}
    assert go["queue > Queue > Pop"].text.startswith("// Pop removes and returns the job")
    rust = {p.symbol_path: p for p in chunks("ledger.rs") if p.kind == "function"}
    assert rust["ledger > Account"].text.startswith("/// One account with its balance in cents.\n#[derive(")
    js = {p.symbol_path: p for p in chunks("routes.js")}
    assert js["routes > parseRoute"].text.startswith("/**\n * Parse a route table line")
    assert js["routes > matchPath"].text.startswith("/** Match a request path")


def test_oversized_function_split_by_lines_under_its_symbol_path():
    pieces = [p for p in chunks("inventory.py", 72) if p.symbol_path == "inventory > cheapest"]
    assert len(pieces) >= 2
    assert pieces[0].text.startswith("def cheapest(parts: list[Part]) -> Part | None:")
    for piece in pieces[1:]:
        assert not piece.text.startswith("def cheapest(")  # its own lines only; the path names the function
        assert piece.line_start > pieces[0].line_start
    assert [p.line_start for p in pieces[1:]] == [p.line_end + 1 for p in pieces[:-1]]


def test_module_code_between_definitions_is_its_own_chunk():
    pieces = chunks("inventory.py")
    assert (pieces[0].symbol_path, pieces[0].kind, pieces[0].line_start, pieces[0].line_end) == (
        "inventory", "module", 1, 9)
    assert "REORDER_LEVEL = 12" in pieces[0].text
    assert pieces[-1].kind == "module" and pieces[-1].text.startswith('if __name__ == "__main__":')


def test_pieces_fit_the_real_models_token_limit(container):
    """Every piece fits all-MiniLM-L6-v2's own tokenizer at its 254-token content limit."""
    embedder = container.embedder
    limit = embedder.max_tokens
    assert limit and limit < 512
    for name in sorted(FIXTURES):
        pieces = chunks(name, limit, embedder.count_tokens)
        assert max(embedder.count_tokens([p.text for p in pieces])) <= limit
        assert_exact_and_complete((CODE / name).read_text(), pieces)
    small = chunks("inventory.py", 40, embedder.count_tokens)
    assert max(embedder.count_tokens([p.text for p in small])) <= 40


def test_unknown_language_and_empty_text_fall_back():
    assert code_chunks("fun main() = println(1)\n", "kotlin", 100, estimate_counts) is None
    assert code_chunks("x = 1\n", None, 100, estimate_counts) is None
    assert code_chunks("\n\n", "python", 100, estimate_counts) is None


def test_broken_source_falls_back():
    """A file that is mostly not Python (error nodes over MAX_ERROR_SHARE) goes to the regex split."""
    assert code_chunks((CODE / "broken.py").read_text(), "python", 100, estimate_counts) is None


def test_a_few_broken_lines_keep_the_tree():
    text = (CODE / "inventory.py").read_text().replace("    def needs_reorder(self, sku: str) -> bool:",
                                                        "    def needs_reorder(self, sku: str -> bool:")
    pieces = code_chunks(text, "python", 400, estimate_counts, module="inventory")
    assert pieces is not None and "inventory > cheapest" in {p.symbol_path for p in pieces}
    assert_exact_and_complete(text, pieces)


def test_missing_grammar_falls_back_with_one_log_line(monkeypatch, caplog):
    """A grammar that does not load (not installed, or built for a newer glibc) costs the tree chunks of its
    language only, with one warning however many files."""
    monkeypatch.setitem(cc.GRAMMARS, "python", cc._g("tree_sitter_not_installed_here", "function_definition"))
    cc._parser.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cc.__name__):
            for _ in range(3):
                assert code_chunks("def f():\n    return 1\n", "python", 100, estimate_counts) is None
    finally:
        cc._parser.cache_clear()
    warnings = [r for r in caplog.records if r.name == cc.__name__]
    assert len(warnings) == 1 and "python" in warnings[0].getMessage()


@pytest.mark.parametrize(("language", "text"), [
    ("python", "x = " + "[" * 10_000 + "]" * 10_000 + "\n"),
    ("c", "int f() {" + "{" * 10_000 + "}" * 10_000 + "}\n"),
    ("javascript", "function f() {" + "(" * 10_000 + "\n"),
    ("python", "def f():\n    return 1\n" * 240_000),  # ~5 MB: over MAX_TREE_BYTES, left to the regex split
])
def test_pathological_files_stay_bounded(language, text):
    started = time.monotonic()
    pieces = code_chunks(text, language, 200, estimate_counts)
    assert time.monotonic() - started < 60  # a hang guard only; benchmarks/code_search.py has timings
    if len(text) > cc.MAX_TREE_BYTES:
        assert pieces is None
    elif pieces is not None:
        assert_exact_and_complete(text, pieces)
        assert max(estimate_counts([p.text for p in pieces])) <= 200


def test_a_line_longer_than_the_budget_is_cut_into_runs_of_that_line():
    text = "def f():\n    return '" + "ab cd " * 400 + "'\n"
    pieces = code_chunks(text, "python", 50, estimate_counts)
    assert pieces is not None and len(pieces) > 5
    assert all(p.line_start in (1, 2) and estimate_counts([p.text])[0] <= 50 for p in pieces)
    assert_exact_and_complete(text, pieces)


# -- through the real ingest path (chunking._Chunker.code -> code_by_tree) -------------------------------------
def test_ingest_path_chunks_code_by_syntax_tree(container, tmp_path):
    """Through the real ingest (parse, chunk with the packaged model's tokenizer, embed, embedded Chroma), a
    Python file's chunks carry symbol paths and the exact lines of their definitions."""
    from research_agent.catalog.collections import create_collection
    from research_agent.ingest import ingest_path
    from research_agent.search.service import query_knowledge

    path = tmp_path / "inventory.py"
    path.write_text((CODE / "inventory.py").read_text())
    create_collection(container, "code")
    report = ingest_path(container, path, "code")
    assert report.added == 1 and not report.failed, report
    hits = query_knowledge(container, "SKUs whose counted units differ from the books", collections=["code"],
                           rerank=False, top_k=3).results
    top = hits[0]
    assert top.header_path.startswith("inventory > Warehouse"), [h.header_path for h in hits]
    lines = path.read_text().split("\n")
    cited = "\n".join(lines[int(top.metadata["line_start"]) - 1:int(top.metadata["line_end"])])
    assert "def discrepancies(" in cited and top.content.endswith(cited), (top.metadata, top.content)
