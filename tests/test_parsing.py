"""Tests for research_agent.ingest.parsing: formats, front matter, binary and broken files."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import pdf_bytes
from research_agent.errors import DocumentError
from research_agent.ingest.parsing import SUPPORTED_EXTENSIONS, ParsedDocument, detect_format, parse_file, parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "docs"


def make_pdf(path: Path, pages: list[str], *, title: str | None = None, password: str | None = None,
             owner_password: str | None = None) -> Path:
    """Write a tiny PDF with one line of Helvetica text per page ("" gives a blank page)."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(len(pages))), len(pages)),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        stream = b"BT /F1 12 Tf 72 720 Td (%s) Tj ET" % text.encode("latin-1") if text else b""
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (5 + 2 * i)
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    path.write_bytes(pdf_bytes(objects))
    if title is not None or password is not None:
        import pypdf

        writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(str(path)))
        if title is not None:
            writer.add_metadata({"/Title": title})
        if password is not None:
            writer.encrypt(user_password=password, owner_password=owner_password, algorithm="AES-256")
        with path.open("wb") as fh:
            writer.write(fh)
    return path


# -- formats -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.md", "markdown"), ("a.MARKDOWN", "markdown"), ("a.mdx", "markdown"), ("a.txt", "text"),
        ("a.rst", "text"), ("a.py", "code"), ("a.tsx", "code"), ("a.pdf", "pdf"), ("a.htm", "html"),
        ("a.html", "html"), ("a.docx", "docx"), ("a.log", None), ("a.exe", None), ("Makefile", None),
    ],
)
def test_detect_format(name: str, expected: str | None) -> None:
    assert detect_format(Path(name)) == expected


def test_supported_extensions_match_detect_format() -> None:
    assert {".md", ".txt", ".py", ".go", ".pdf", ".html", ".docx"} <= SUPPORTED_EXTENSIONS
    assert ".log" not in SUPPORTED_EXTENSIONS
    assert all(ext.startswith(".") and detect_format(Path("x" + ext)) for ext in SUPPORTED_EXTENSIONS)


@pytest.mark.parametrize(
    ("name", "language"),
    [("m.py", "python"), ("m.js", "javascript"), ("m.ts", "typescript"), ("m.go", "go"), ("m.rs", "rust"),
     ("M.java", "java"), ("m.c", "c"), ("m.hpp", "cpp"), ("m.sh", "bash"), ("m.sql", "sql"), ("m.yml", "yaml"),
     ("m.json", "json"), ("m.toml", "toml")],
)
def test_code_language_by_extension(tmp_path: Path, name: str, language: str) -> None:
    path = tmp_path / name
    path.write_text("x = 1\n")
    doc = parse_file(path)
    assert (doc.format, doc.code_language, doc.title, doc.text) == ("code", language, None, "x = 1\n")


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("# not a title in a text file\n\nsecond paragraph\n")
    doc = parse_file(path)
    assert (doc.format, doc.title, doc.metadata, doc.pages) == ("text", None, {}, None)
    assert doc.text.startswith("# not a title")


# -- markdown and front matter -----------------------------------------------------------------


def test_markdown_fixture_front_matter() -> None:
    doc = parse_file(FIXTURES / "guide_install.md")
    assert doc.format == "markdown"
    assert doc.title == "Installation Guide"
    assert doc.metadata["description"] == "How to install and configure the widget service."
    assert doc.metadata["keywords"] == ["install", "setup", "linux"]
    assert doc.metadata["version"] == 2
    assert doc.metadata["date"] == "2024-05-01"  # YAML dates become ISO strings
    assert doc.text.startswith("This guide covers")
    assert "title:" not in doc.text and not doc.text.startswith("---")


def test_front_matter_list_tags_and_nested_values_dropped() -> None:
    doc = parse_file(FIXTURES / "guide_api.md")
    assert doc.title == "API Reference"
    assert doc.metadata == {"title": "API Reference", "tags": ["api", "reference", "http"]}


def test_front_matter_value_normalization() -> None:
    doc = parse_text("---\nkeywords: [1, two, '', null]\ntags: 'a, b ,, c'\nauthors: [ann, {x: 1}]\n"
                     "empty:\n---\nBody\n")
    assert doc.metadata == {"keywords": ["1", "two"], "tags": ["a", "b", "c"], "authors": ["ann"]}
    assert doc.text == "Body\n"


def test_title_falls_back_to_first_h1_outside_code_fences() -> None:
    doc = parse_text("```\n# Not the title\n```\n\nIntro\n\n## Sub\n\n# Real Title #\n")
    assert doc.title == "Real Title"
    assert parse_text("No headers here.").title is None


def test_broken_front_matter_keeps_the_body_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    # Issue 8: a file whose front matter stops parsing must still replace its old chunks, so the
    # body is used (7 of 55 real model cards were skipped whole when this raised).
    doc = parse_text("---\ntitle: [unclosed\n---\n# Card\n\nBody\n", name="bad.md")
    assert (doc.text, doc.title, doc.metadata) == ("# Card\n\nBody\n", "Card", {})
    assert len(doc.warnings) == 1
    assert doc.warnings[0].startswith("Front matter of bad.md ignored: invalid YAML (line 3)")
    assert doc.warnings[0] in caplog.text


@pytest.mark.parametrize(
    "front_matter",
    [
        "tags: [a, b]\n\tindented: with a tab\n",  # a tab where YAML wants spaces
        "key: [" * 2000 + "\n",  # nested deeper than the YAML composer recurses
        "title: x\n" * 40_000,  # over the size limit
        "title: a\x01b\n",  # a control character YAML's reader refuses before parsing (the file was dropped)
        "title: \x85next\n",  # a C1 character
    ],
    ids=["tab", "deep", "huge", "control", "c1"],
)
def test_unusable_front_matter_of_a_file_is_skipped_not_the_file(tmp_path: Path, front_matter: str) -> None:
    path = tmp_path / "card.md"
    path.write_text(f"---\n{front_matter}---\n# Model card\n\nWeights and usage.\n")
    doc = parse_file(path)
    assert doc.text == "# Model card\n\nWeights and usage.\n"
    assert doc.title == "Model card" and doc.metadata == {}
    assert len(doc.warnings) == 1 and "card.md" in doc.warnings[0]


@pytest.mark.parametrize(
    "front_matter",
    [
        "title: Card\ncreated: 2023-02-30\n",  # a date YAML recognises but no calendar has (ValueError, not YAMLError)
        "title: Card\ndate: 2024-13-45\n",  # month 13
        "title: \"unclosed\ntags: [a\n",  # an unclosed quote and bracket
    ],
    ids=["impossible-day", "impossible-month", "unclosed-quote"],
)
def test_front_matter_that_fails_to_construct_keeps_the_body(tmp_path: Path, front_matter: str) -> None:
    # Issue 17: 7 of 55 real model cards were dropped whole; an impossible date still raised past the YAML handler.
    path = tmp_path / "card.md"
    path.write_text(f"---\n{front_matter}---\n# Model card\n\nWeights and usage.\n")
    doc = parse_file(path)
    assert (doc.text, doc.title, doc.metadata) == ("# Model card\n\nWeights and usage.\n", "Model card", {})
    assert len(doc.warnings) == 1 and doc.warnings[0].startswith("Front matter of card.md ignored: invalid YAML")


def test_good_front_matter_has_no_warnings() -> None:
    assert parse_file(FIXTURES / "guide_install.md").warnings == []


def test_unclosed_front_matter_is_plain_markdown() -> None:
    doc = parse_text("---\nnot front matter\n")
    assert (doc.metadata, doc.text) == ({}, "---\nnot front matter\n")


def test_bom_and_crlf_are_normalized(tmp_path: Path) -> None:
    path = tmp_path / "win.md"
    path.write_bytes("\ufeff---\r\ntitle: Win\r\n---\r\n# Head\r\nline\r\n".encode())
    doc = parse_file(path)
    assert (doc.title, doc.text) == ("Win", "# Head\nline\n")


# -- failures ----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="File not found") as info:
        parse_file(tmp_path / "nope.md")
    assert info.value.exit_code == 5
    assert info.value.data["path"].endswith("nope.md")
    with pytest.raises(DocumentError, match="Not a file"):
        parse_file(tmp_path)


def test_unsupported_extension_lists_supported(tmp_path: Path) -> None:
    path = tmp_path / "app.log"
    path.write_text("hello")
    with pytest.raises(DocumentError, match="Unsupported file type") as info:
        parse_file(path)
    assert ".md" in info.value.data["guidance"] and ".pdf" in info.value.data["guidance"]


def test_too_large(tmp_path: Path) -> None:
    path = tmp_path / "big.md"
    path.write_text("x" * 101)
    with pytest.raises(DocumentError, match="100-byte limit"):
        parse_file(path, max_bytes=100)
    assert parse_file(path, max_bytes=101).text == "x" * 101


def test_nul_byte_is_binary(tmp_path: Path) -> None:
    path = tmp_path / "blob.txt"
    path.write_bytes(b"text\x00more")
    with pytest.raises(DocumentError, match="binary"):
        parse_file(path)


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("utf-16", b""), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"), ("utf-32", b""),
     ("utf-16-le", b""), ("utf-16-be", b"")],
    ids=["utf16-bom", "utf16le-bom", "utf16be-bom", "utf32-bom", "utf16le-no-bom", "utf16be-no-bom"],
)
def test_utf16_and_utf32_text_is_decoded(tmp_path: Path, encoding: str, bom: bytes) -> None:
    # Issue 15: Windows tools write UTF-16; its NUL bytes made it look binary.
    text = "# Notes\r\n\r\nCaf\u00e9 na\u00efve \u2014 \u65e5\u672c plus ASCII lines.\r\n" * 20
    path = tmp_path / "notes.md"
    path.write_bytes(bom + text.encode(encoding))
    doc = parse_file(path)
    assert doc.title == "Notes"
    assert doc.text == text.replace("\r\n", "\n")


@pytest.mark.parametrize(
    "blob",
    [
        bytes(range(256)) * 8,  # all byte values
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200),  # an image header
        b"".join(n.to_bytes(2, "little") for n in range(1, 32)) * 50,  # small 16-bit integers: NUL every other byte
        b"\xff\xfe" + b"".join(n.to_bytes(2, "little") for n in range(1, 32)) * 50,  # a UTF-16 mark, control chars
    ],
    ids=["bytes", "png", "int16", "bom-control"],
)
def test_binary_is_still_refused(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(blob)
    with pytest.raises(DocumentError, match="looks binary") as info:
        parse_file(path)
    assert info.value.exit_code == 5


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.md"
    path.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(DocumentError, match="not valid UTF-8 text"):
        parse_file(path)


def test_parse_text_rejects_binary_formats() -> None:
    with pytest.raises(DocumentError):
        parse_text("x", format="pdf")
    assert parse_text("package main", format="code", name="main.go").code_language == "go"


# -- HTML --------------------------------------------------------------------------------------


def test_html_fixture_to_markdown() -> None:
    doc = parse_file(FIXTURES / "page.html")
    assert (doc.format, doc.title) == ("html", "Widget Handbook")
    assert doc.text.split("\n\n")[:3] == [
        "# Widget Handbook",
        "Widgets are small reusable parts. Use `widget run` to start one.",
        "## Install",
    ]
    assert "```bash\npip install widget\nwidget --version\n```" in doc.text
    assert "| OS | Status |\n|---|---|\n| Linux | Supported |\n| Windows | Beta |" in doc.text
    assert "- Start a widget\n- Stop a widget" in doc.text
    for dropped in ("tracking", "color: red", "Site banner", "Menu one", "Related links", "Copyright", "Search"):
        assert dropped not in doc.text


def test_html_without_main_keeps_article_header_and_escapes_hashes() -> None:
    html = ("<html><body><header>Site</header><article><header><h1>Post</h1></header>"
            "<p># not a header</p><div>loose <b>text</b></div></article></body></html>")
    doc = parse_text(html, format="html")
    assert doc.title == "Post"
    assert doc.text == "# Post\n\n\\# not a header\n\nloose text"


# -- PDF ---------------------------------------------------------------------------------------


def test_pdf_pages_and_title(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "doc.pdf", ["First page text.", "", "Third page text."], title="Tiny PDF")
    doc = parse_file(path)
    assert doc.format == "pdf"
    assert doc.title == "Tiny PDF"
    assert doc.pages == [(1, "First page text."), (3, "Third page text.")]
    assert doc.text == "First page text.\n\nThird page text."


def test_encrypted_pdf_raises(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "locked.pdf", ["Secret."], password="secret", owner_password="owner")
    with pytest.raises(DocumentError, match="encrypted") as info:
        parse_file(path)
    assert "unencrypted" in info.value.data["guidance"]


def test_pdf_with_only_owner_password_is_readable(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "owner.pdf", ["Open to read."], password="", owner_password="owner")
    assert parse_file(path).pages == [(1, "Open to read.")]


def test_corrupt_pdf_raises(tmp_path: Path) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    with pytest.raises(DocumentError, match="not a readable PDF"):
        parse_file(path)


def test_pdf_without_text_raises(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="no extractable text"):
        parse_file(make_pdf(tmp_path / "scan.pdf", ["", ""]))


# -- DOCX --------------------------------------------------------------------------------------


def test_docx_headings_lists_and_tables(tmp_path: Path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("Team Handbook", level=0)
    document.add_paragraph("Welcome to the team.")
    document.add_heading("Tools", level=1)
    document.add_paragraph("Editor", style="List Bullet")
    document.add_paragraph("Terminal", style="List Bullet")
    document.add_heading("Versions", level=2)
    table = document.add_table(rows=2, cols=2)
    for row, values in zip(table.rows, [("Tool", "Version"), ("git", "2.4|x")]):
        for cell, value in zip(row.cells, values):
            cell.text = value
    document.add_paragraph("# hash at start")
    path = tmp_path / "handbook.docx"
    document.save(str(path))

    doc = parse_file(path)
    assert (doc.format, doc.title) == ("docx", "Team Handbook")
    assert doc.text.split("\n\n") == [
        "# Team Handbook",
        "Welcome to the team.",
        "# Tools",
        "- Editor\n- Terminal",
        "## Versions",
        "| Tool | Version |\n|---|---|\n| git | 2.4\\|x |",
        "\\# hash at start",
    ]


def test_corrupt_docx_raises(tmp_path: Path) -> None:
    path = tmp_path / "broken.docx"
    path.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(DocumentError, match="not a readable DOCX"):
        parse_file(path)


def test_parsed_document_defaults() -> None:
    doc = ParsedDocument(text="x", format="text")
    assert (doc.title, doc.metadata, doc.code_language, doc.pages) == (None, {}, None, None)
