"""Excel workbooks (.xlsx) as documents in add-folder (issue 17): each sheet a `# sheet` section of Markdown
tables under `## Rows a-b` headings that use the sheet's own row numbers (as Excel shows them, so a hit cites
`Rivers!4-7`), values not formulas, bounded rows and cells, and coded errors for encrypted or broken files.

The fixture tests/fixtures/formats/rivers.xlsx is written by tests/fixtures/formats/make_xlsx.py (openpyxl,
with the formula's cached value as Excel saves it); the hostile workbooks are built here with openpyxl.
"""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import pytest

from research_agent.errors import DocumentError
from research_agent.ingest import parsing
from research_agent.ingest.chunking import chunk_document

RIVERS = Path(__file__).parent / "fixtures" / "formats" / "rivers.xlsx"

RIVERS_TEXT = """# Rivers

Rivers of the world (sample)

## Rows 4-7

| river | country | length_km | surveyed | note |
|---|---|---|---|---|
| Danube | Austria | 2850 | 2021-05-04 | flows east \\| into the Black Sea |
| Mekong | Laos | 4909 | 2019-11-30 | rice basin |
| Orinoco | Venezuela | 2140 |  |  |
| total |  | 9899 |  |  |

# Notes

## Rows 2-2

| note |
|---|
| The Mekong length is disputed between surveys. |"""


def _workbook(fill) -> bytes:
    from openpyxl import Workbook

    wb = Workbook()
    fill(wb.active)
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def test_each_sheet_is_tables_under_its_name_with_the_sheets_row_numbers():
    doc = parsing.parse_bytes(RIVERS.read_bytes(), RIVERS)
    assert parsing.detect_format(RIVERS) == "xlsx" and doc.format == "xlsx"
    assert doc.text == RIVERS_TEXT  # the caption row is prose, the header is sheet row 3, data rows 4-7
    assert "SUM(" not in doc.text  # the formula's value (9899), never the formula
    chunks = chunk_document(doc, source="rivers.xlsx", title="rivers")
    assert [c.header_path for c in chunks] == ["Rivers", "Rivers > Rows 4-7", "Notes > Rows 2-2"]
    assert all(c.content_type == "table" and c.text.startswith("## Rows ") for c in chunks[1:])
    assert "| Mekong | Laos | 4909 | 2019-11-30 | rice basin |" in chunks[1].text


def test_rows_are_cut_into_tables_of_capped_rows_each_with_its_header(monkeypatch):
    monkeypatch.setattr(parsing, "CSV_ROWS_PER_TABLE", 2)

    def fill(ws):
        ws.append(["id", "name"])
        for i in range(1, 6):
            ws.append([i, f"item {i}"])
            if i == 2:
                ws.append([])  # a blank row is skipped; the numbers stay the sheet's

    doc = parsing.parse_bytes(_workbook(fill), Path("items.xlsx"))
    assert [line for line in doc.text.split("\n") if line.startswith("## ")] == [
        "## Rows 2-3", "## Rows 5-6", "## Rows 7-7"]
    assert doc.text.count("| id | name |\n|---|---|") == 3 and "| 5 | item 5 |" in doc.text


@pytest.mark.parametrize("limit,value,message", [
    ("XLSX_MAX_ROWS", 40, "more than 40 rows"),
    ("XLSX_MAX_CELLS", 100, "more than 100 cells"),
])
def test_a_workbook_over_the_row_or_cell_limit_is_a_coded_error(monkeypatch, limit, value, message):
    monkeypatch.setattr(parsing, limit, value)
    raw = _workbook(lambda ws: [ws.append([i, "x", "y"]) for i in range(60)])
    with pytest.raises(DocumentError, match=message) as info:
        parsing.parse_bytes(raw, Path("big.xlsx"))
    assert "CSV" in info.value.data["guidance"]


def test_a_far_away_cell_does_not_make_a_million_empty_rows():
    """One cell at XFD1048576 (the last of the sheet): the reader would walk 1,048,575 blank rows of 16,384
    cells; it stops at the row limit instead, fast."""
    def fill(ws):
        ws["A1"], ws["B1"] = "a", "b"
        ws["XFD1048576"] = "far"

    began = time.monotonic()
    with pytest.raises(DocumentError, match="rows"):
        parsing.parse_bytes(_workbook(fill), Path("far.xlsx"))
    assert time.monotonic() - began < 60  # a hang guard, not a timing goal


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buf.getvalue()


# An encrypted OOXML file is an OLE compound file (the zip inside it is encrypted); a legacy .xls is one too.
OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 504


@pytest.mark.parametrize("raw,reason", [
    (OLE, "encrypted \\(password-protected\\) or an old-style .xls"),
    (b"", "not a readable XLSX"),
    (b"PK\x03\x04 not really a zip", "not a readable XLSX"),
    (_zip({"hello.txt": b"hi"}), "not a readable XLSX"),
    (_zip({"[Content_Types].xml": b"<Types/>", "xl/workbook.xml": b"<not closed"}), "not a readable XLSX"),
    (RIVERS.read_bytes()[:3000], "not a readable XLSX"),
])
def test_encrypted_or_broken_workbooks_are_coded_errors(raw, reason):
    with pytest.raises(DocumentError, match=reason) as info:
        parsing.parse_bytes(raw, Path("bad.xlsx"))
    assert info.value.data["guidance"] and info.value.data.get("path") == "bad.xlsx"


def test_a_workbook_inflating_past_the_xml_limit_is_refused_before_reading(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_XLSX_XML_BYTES", 1000)
    with pytest.raises(DocumentError, match="inflates to"):
        parsing.parse_bytes(RIVERS.read_bytes(), RIVERS)


@pytest.mark.slow
def test_add_folder_round_trip_of_a_workbook(container):
    """Real model and store: the workbook is found by a question about a row, re-adding writes nothing, and a
    broken workbook next to it is skipped with its reason."""
    from research_agent import ingest
    from research_agent.catalog import collections
    from research_agent.search import service as query

    folder = Path.cwd() / "sheets"
    folder.mkdir()
    (folder / "rivers.xlsx").write_bytes(RIVERS.read_bytes())
    (folder / "locked.xlsx").write_bytes(OLE)
    collections.create_collection(container, "sheets")
    report = ingest.ingest_path(container, folder, "sheets")
    assert report.documents == ["sheets/rivers.xlsx"]
    assert [(p.path, "password-protected" in p.reason) for p in report.skipped] == [("sheets/locked.xlsx", True)]
    assert ingest.ingest_path(container, folder, "sheets").chunks_written == 0
    hits = query.query_knowledge(container, "Orinoco river in Venezuela, length in km", collections=["sheets"],
                                 rerank=False).results
    top = hits[0]
    assert top.metadata["source_document"] == "sheets/rivers.xlsx" and "| Orinoco | Venezuela | 2140 |" in top.content
    assert top.metadata["header_path"] == "Rivers > Rows 4-7"


def _renamed_part_workbook(media: bytes = b"") -> tuple[bytes, int, int]:
    """A workbook whose worksheet part is `xl/worksheets/sheet1.bin` (openpyxl finds parts through the .rels
    and [Content_Types].xml whatever their names), plus an optional picture under xl/media; (bytes, size of
    the renamed part, size of the other parts)."""
    raw = _workbook(lambda ws: [ws.append([f"word{i}", f"other{i}"]) for i in range(2000)])
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        sizes = {e.filename: e.file_size for e in src.infolist()}
        for name in src.namelist():
            data = src.read(name).replace(b"sheet1.xml", b"sheet1.bin")
            dst.writestr(name.replace("sheet1.xml", "sheet1.bin"), data)
        if media:
            dst.writestr("xl/media/image1.png", media)
    part = sizes["xl/worksheets/sheet1.xml"]
    return out.getvalue(), part, sum(sizes.values()) - part


def test_a_renamed_xml_part_counts_against_the_xml_limit(monkeypatch):
    """The XML cap counted only names ending .xml/.rels: 230 MB of shared strings stored as xl/strings.bin
    took 129 s and 1.39 GB before a skip (outside tester). Every entry that may be XML counts now."""
    raw, strings, rest = _renamed_part_workbook()
    assert "word1999" in parsing.parse_bytes(raw, Path("renamed.xlsx")).text  # openpyxl does read the part
    monkeypatch.setattr(parsing, "MAX_XLSX_XML_BYTES", rest + strings // 2)
    with pytest.raises(DocumentError, match="inflates to"):
        parsing.parse_bytes(raw, Path("renamed.xlsx"))


def test_pictures_do_not_count_against_the_xml_limit(monkeypatch):
    picture = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 400  # 100 KB of a binary picture
    raw, strings, rest = _renamed_part_workbook(media=picture)
    monkeypatch.setattr(parsing, "MAX_XLSX_XML_BYTES", rest + strings + 1000)
    assert "word1999" in parsing.parse_bytes(raw, Path("pictures.xlsx")).text


def test_a_one_row_summary_sheet_is_kept_as_a_table():
    """A sheet holding only `Total | 4242` was dropped as "no text content" (outside tester)."""
    text = parsing.parse_bytes(_workbook(lambda ws: ws.append(["Total", 4242])), Path("sum.xlsx")).text
    assert text == "# Sheet\n\n## Rows 1-1\n\n| Total | 4242 |\n|---|---|"
