"""Notebooks (.ipynb) and CSV/TSV tables as documents in add-folder (issue 17): what the readers keep and
drop, how tables are chunked (header repeated, rows capped), and a folder round trip on the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research_agent.errors import DocumentError
from research_agent.ingest import parsing
from research_agent.ingest.chunking import chunk_document


def _notebook(cells: list[dict], language: str = "python") -> bytes:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": cells,
                       "metadata": {"kernelspec": {"name": "k", "language": language}}}).encode()


NOTEBOOK = _notebook([
    {"cell_type": "markdown", "source": ["# Churn analysis\n", "\n", "We load the **orders** table."]},
    {"cell_type": "code", "source": "import pandas as pd\ndf = pd.read_csv('orders.csv')",
     "outputs": [{"output_type": "stream", "text": "SECRET-OUTPUT 12345"}], "execution_count": 1},
    {"cell_type": "raw", "source": "raw cell text"},
    {"cell_type": "code", "source": ["print('```')\n"], "outputs": []},
    {"cell_type": "markdown", "source": []},
])


def test_notebook_keeps_markdown_and_fenced_code_and_drops_outputs():
    doc = parsing.parse_bytes(NOTEBOOK, Path("churn.ipynb"))
    assert doc.format == "notebook" and doc.title == "Churn analysis"
    assert "We load the **orders** table." in doc.text
    assert "```python\nimport pandas as pd\ndf = pd.read_csv('orders.csv')\n```" in doc.text
    assert "````python\nprint('```')\n````" in doc.text  # a fence inside code gets a longer fence
    assert "SECRET-OUTPUT" not in doc.text and "raw cell text" not in doc.text
    chunks = chunk_document(doc, source="churn.ipynb")
    code = [c for c in chunks if c.content_type == "code_block"]
    assert code and code[0].code_language == "python" and code[0].header_path == "Churn analysis"


def test_notebook_language_from_the_kernel_and_nbformat_3():
    r_nb = _notebook([{"cell_type": "code", "source": "x <- 1"}], language="R")
    assert "```r\nx <- 1\n```" in parsing.parse_bytes(r_nb, Path("a.ipynb")).text
    v3 = json.dumps({"nbformat": 3, "metadata": {}, "worksheets": [{"cells": [
        {"cell_type": "heading", "level": 2, "source": "Setup"},
        {"cell_type": "code", "input": "a = 1", "outputs": []}]}]}).encode()
    assert parsing.parse_bytes(v3, Path("old.ipynb")).text == "## Setup\n\n```python\na = 1\n```"


@pytest.mark.parametrize("raw, reason", [
    (b"{not json", "not a readable notebook"),
    (b'{"cells": "nope"}', "not a Jupyter notebook"),
    (b"[" * 100_000, "not a readable notebook"),
])
def test_a_notebook_that_does_not_parse_is_a_document_error(raw, reason):
    with pytest.raises(DocumentError, match=reason):
        parsing.parse_bytes(raw, Path("bad.ipynb"))


def test_csv_becomes_tables_of_capped_rows_each_with_its_header(monkeypatch):
    monkeypatch.setattr(parsing, "CSV_ROWS_PER_TABLE", 2)
    raw = b"sku,name,price\nA1,Widget,3\nA2,Gadget | Pro,5\n\nA3,Gizmo,7\nA4,Doohickey,9\nA5,Thing,1\n"
    doc = parsing.parse_bytes(raw, Path("prices.csv"))
    assert doc.format == "csv"
    tables = doc.text.split("\n\n## ")
    assert len(tables) == 3 and doc.text.startswith("## Rows 1-2\n\n| sku | name | price |")
    assert all("| sku | name | price |\n|---|---|---|" in t for t in tables)
    assert "Gadget \\| Pro" in doc.text and tables[2].startswith("Rows 5-5")
    chunks = chunk_document(doc, source="prices.csv", title="prices")
    assert [c.header_path for c in chunks] == ["Rows 1-2", "Rows 3-4", "Rows 5-5"]
    assert all(c.content_type == "table" and "| sku | name | price |" in c.text for c in chunks)


def test_a_long_csv_table_is_split_by_rows_with_the_header_repeated():
    rows = "".join(f"r{i},{'word ' * 20}\n" for i in range(50))
    doc = parsing.parse_bytes(("id,text\n" + rows).encode(), Path("long.csv"))
    chunks = chunk_document(doc, source="long.csv", max_tokens=120)
    assert len(chunks) > 3
    assert all(c.text.splitlines()[c.text.splitlines().index("| id | text |") + 1] == "|---|---|" for c in chunks)


def test_tsv_and_a_csv_field_over_the_csv_limit():
    assert "| a | b |" in parsing.parse_bytes(b"a\tb\n1\t2\n", Path("t.tsv")).text
    with pytest.raises(DocumentError, match=r"not readable CSV \(line 2"):
        parsing.parse_bytes(b'id,text\n1,"' + b"y" * (10 * 2**20) + b'"\n', Path("huge.csv"))


@pytest.mark.slow
def test_add_folder_round_trip_of_notebooks_and_csv(container):
    from research_agent import ingest
    from research_agent.catalog import collections
    from research_agent.search import service as query

    folder = Path.cwd() / "data"
    folder.mkdir()
    (folder / "churn.ipynb").write_bytes(NOTEBOOK)
    (folder / "broken.ipynb").write_text("{oops")
    (folder / "rivers.csv").write_text("river,country,length_km\nDanube,Austria,2850\nMekong,Laos,4909\n"
                                       "Orinoco,Venezuela,2140\n")
    collections.create_collection(container, "tables")
    report = ingest.ingest_path(container, folder, "tables")
    assert sorted(report.documents) == ["data/churn.ipynb", "data/rivers.csv"]
    assert [(p.path, "not a readable notebook" in p.reason) for p in report.skipped] == [("data/broken.ipynb", True)]
    again = ingest.ingest_path(container, folder, "tables")
    assert (again.unchanged, again.chunks_written) == (2, 0)
    hits = query.query_knowledge(container, "Mekong river length", collections=["tables"], rerank=False).results
    assert hits[0].metadata["source_document"] == "data/rivers.csv" and "| Mekong | Laos | 4909 |" in hits[0].content
    doc = ingest.get_document(container, "tables", "data/churn.ipynb")
    assert "pd.read_csv" in doc.content and "SECRET-OUTPUT" not in doc.content
