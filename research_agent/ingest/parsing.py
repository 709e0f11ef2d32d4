"""File readers: markdown, text, code, PDF, HTML, DOCX, notebook, CSV and XLSX files in one ParsedDocument shape.

Every reader is bounded (issue 11): a hostile file ends in a DocumentError with a reason, fast, in
bounded memory; it never hangs, crashes or eats the machine. The limits below are module constants
so the lead can promote them to settings.

Over 400 lines (~990) on purpose for now: the PDF, DOCX, XLSX, HTML, notebook and CSV readers (second half) read these
limits as this module's globals, and the parser-bomb tests lower them on this module
(`setattr(parsing, "PARSE_SECONDS", ...)` in a child process). Moving the readers into their own module
means moving the limits with them and pointing those tests there; left for a step that does both.
"""

from __future__ import annotations

import codecs
import datetime as _dt
import io
import logging
import re
import time
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from research_agent.errors import DocumentError

log = logging.getLogger(__name__)

# -- limits ------------------------------------------------------------------------------------
#: Total bytes a file may inflate to: the declared sizes of all DOCX zip entries, and the decoded
#: content streams of all PDF pages. A 0.84 MB DOCX inflated to 300 MB of XML and took 3 GB.
MAX_DECOMPRESSED_BYTES = 256 * 2**20
#: XML parts of a DOCX: python-docx holds an lxml tree of them, up to 16x their size (38 MB of
#: one-word paragraphs: 615 MB, 34 s; 300 MB of XML: 3 GB). Word writes roughly 1 KB of XML per
#: paragraph, so 16 MB is some 10,000+ paragraphs.
MAX_DOCX_XML_BYTES = 16 * 2**20
#: Zip entries in a DOCX; Word writes 10-100.
MAX_ZIP_ENTRIES = 10_000
#: Pages in a PDF. A 300 KB file of 50,000 references to one page took 12 s and 48 MB.
MAX_PDF_PAGES = 2_000
#: One decoded PDF stream (pypdf's own default is 75 MB: one such page took 6 s and 346 MB).
MAX_PDF_STREAM_BYTES = 16 * 2**20
#: Wall time per file, checked between pages, paragraphs and HTML elements (no signals or threads,
#: so it works in the MCP server's worker threads). A 5 KB PDF of 300 pages sharing one 1 MB
#: content stream ran over 5 minutes.
PARSE_SECONDS = 60.0
#: Characters of extracted text per file: about three times what the default limit of 5,000 chunks
#: of 350 tokens holds (some 7M characters).
MAX_TEXT_CHARS = 20_000_000
#: HTML elements: BeautifulSoup costs about 1 KB and 16 us per element (1M elements: 990 MB, 16 s).
MAX_HTML_ELEMENTS = 250_000
#: YAML front matter, raw and after expanding aliases and merge keys: 551 bytes of nested `<<: *a`
#: merges took 2.7 GB and 50 s in yaml.safe_load (then a MemoryError, which ended the whole run).
MAX_FRONT_MATTER_BYTES = 256 * 1024
MAX_FRONT_MATTER_NODES = 50_000
#: Data rows per Markdown table of a CSV file, each table under a `## Rows a-b` heading with the header row
#: repeated, so every chunk reads as a table and cites its rows: 50 rows of a few short columns is about one
#: chunk of 350 tokens (a longer table is split by rows by the chunker, the header repeated again).
CSV_ROWS_PER_TABLE = 50
#: Rows read per .xlsx workbook, blank rows between data rows counted: the reader walks every row up to the
#: last one a sheet writes, so one cell at row 1,048,576 (the last) would be a million empty rows.
XLSX_MAX_ROWS = 100_000
#: Cells read per .xlsx workbook, empty ones inside rows counted (a row is as wide as its last cell: one cell
#: in column XFD makes 16,384). A million short cells is some 10 MB of Markdown, about 5,000 chunks.
XLSX_MAX_CELLS = 1_000_000
#: XML parts of an .xlsx, inflated: openpyxl streams sheets in read-only mode but holds every shared string
#: (a workbook's text cells) in memory. Excel writes about 100 bytes of XML per cell, so 64 MB is some
#: 600,000 cells, above what XLSX_MAX_CELLS lets through.
MAX_XLSX_XML_BYTES = 64 * 2**20

MARKDOWN_EXTENSIONS = frozenset({".md", ".markdown", ".mdx"})
TEXT_EXTENSIONS = frozenset({".txt", ".rst"})
CODE_LANGUAGES: dict[str, str] = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".scala": "scala",
    ".c": "c", ".h": "c", ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".cs": "csharp", ".rb": "ruby", ".php": "php", ".swift": "swift", ".lua": "lua", ".r": "r",
    ".pl": "perl", ".ex": "elixir", ".exs": "elixir", ".hs": "haskell", ".dart": "dart",
    ".sh": "bash", ".bash": "bash", ".zsh": "bash", ".ps1": "powershell", ".sql": "sql",
    ".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml", ".ini": "ini", ".cfg": "ini",
    ".css": "css", ".scss": "scss", ".vue": "vue", ".svelte": "svelte", ".proto": "protobuf", ".tf": "hcl",
}
_OTHER_FORMATS = {".pdf": "pdf", ".html": "html", ".htm": "html", ".docx": "docx", ".ipynb": "notebook",
                  ".csv": "csv", ".tsv": "csv", ".xlsx": "xlsx"}
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset(
    MARKDOWN_EXTENSIONS | TEXT_EXTENSIONS | CODE_LANGUAGES.keys() | _OTHER_FORMATS.keys()
)

_BINARY_SNIFF_BYTES = 8192
# Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# Control characters other than tab, newline, form feed and carriage return: binary if common.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_FRONT_MATTER_END = re.compile(r"^(?:---|\.\.\.)[ \t]*$", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
#: Matched on the line without trailing blanks, the closing `#` run removed by strip_closing_hashes: the
#: one-pattern form `(.+?)(?:[ \t]+#+)?[ \t]*$` backtracked quadratically on a long run of blanks (100 KB: over
#: 20 s; tests/test_ingest_text_linear.py).
_H1 = re.compile(r"^ {0,3}#[ \t]+(.+)$")


def strip_closing_hashes(text: str) -> str:
    """An ATX heading's text without its optional closing `#` run (`# Title ##` -> `Title`); a run not set off
    by a blank is part of the text (`C##`), and a text that is only hashes is kept (`# ##` -> `##`)."""
    body = text.rstrip("#")
    if body != text and body and body[-1] in " \t":
        return body.rstrip(" \t")
    return text
# A prose line that starts like markdown syntax would become a header or fence in the chunker.
_MARKDOWN_LOOKALIKE = re.compile(r"(?m)^([ \t]{0,3})(#|```|~~~)")


@dataclass
class ParsedDocument:
    """A file's text in normalized form plus what the chunker and the store need to know about it."""

    text: str
    format: str
    title: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    code_language: str | None = None
    pages: list[tuple[int, str]] | None = None
    #: Problems the reader worked around (e.g. front matter that did not parse): the file is still used.
    warnings: list[str] = field(default_factory=list)
    #: The file's line (1-based) where `text` begins: after the front matter, so chunk line ranges point
    #: into the file as an editor shows it. Meaningful for markdown, text and code (their text is the file's).
    first_line: int = 1


class _Limits:
    """One file's deadline and text budget, checked between pages, paragraphs and elements."""

    def __init__(self, name: str, path: Path | None = None) -> None:
        self.name = name or "document"
        self.path = str(path) if path is not None else None
        self.deadline = time.monotonic() + PARSE_SECONDS
        self.chars = 0
        self.inflated = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            self._refuse(f"took more than {PARSE_SECONDS:g} s to parse",
                         "Split the file, or convert it to plain text or markdown and ingest that.")

    def add_text(self, chars: int) -> None:
        self.chars += chars
        if self.chars > MAX_TEXT_CHARS:
            self._refuse(f"holds more than {MAX_TEXT_CHARS:,} characters of text",
                         "Split the file into smaller documents.")

    def add_inflated(self, size: int) -> None:
        self.inflated += size
        if self.inflated > MAX_DECOMPRESSED_BYTES:
            self._refuse(f"inflates to more than {MAX_DECOMPRESSED_BYTES // 2**20} MB"
                         " (a compression bomb, or far larger than it looks)",
                         "Split the file, or export it to plain text or markdown and ingest that.")

    def _refuse(self, why: str, guidance: str) -> None:
        raise DocumentError(f"{self.name} {why}", guidance=guidance, path=self.path)


def detect_format(path: Path) -> str | None:
    """The format a file is read as, by extension; None when unsupported."""
    ext = Path(path).suffix.lower()
    if ext in MARKDOWN_EXTENSIONS:
        return "markdown"
    if ext in TEXT_EXTENSIONS:
        return "text"
    if ext in CODE_LANGUAGES:
        return "code"
    return _OTHER_FORMATS.get(ext)


def parse_file(path: Path, *, max_bytes: int | None = None) -> ParsedDocument:
    """Read one file; raises DocumentError with a reason when it cannot be used."""
    path = Path(path)
    if not path.is_file():
        problem = "Not a file" if path.exists() else "File not found"
        raise DocumentError(
            f"{problem}: {path}", guidance="Check the path; it must be an existing file.", path=str(path)
        )
    _require_format(path)
    try:
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise DocumentError(
                f"{path.name} is {size} bytes, over the {max_bytes}-byte limit",
                guidance="Raise the maximum file size setting or split the file.",
                path=str(path),
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise DocumentError(
            f"Cannot read {path.name}: {exc.strerror or exc}", guidance="Check the file's permissions.", path=str(path)
        ) from exc
    return parse_bytes(raw, path)


def parse_bytes(raw: bytes, path: Path) -> ParsedDocument:
    """Parse a file's bytes already read, named by `path` (its extension picks the reader). Ingestion hashes
    and parses the same bytes, so the stored hash always describes the indexed text, for PDF and DOCX too."""
    path = Path(path)
    fmt = _require_format(path)
    if fmt == "pdf":
        return _parse_pdf(path, _Limits(path.name, path), raw)
    if fmt == "docx":
        return _parse_docx(path, _Limits(path.name, path), raw)
    if fmt == "xlsx":
        return _parse_xlsx(path, _Limits(path.name, path), raw)
    if fmt == "notebook":
        return _parse_notebook(path, _decode(raw, path), _Limits(path.name, path))
    if fmt == "csv":
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        return _parse_csv(path, _normalize_newlines(_decode(raw, path)), _Limits(path.name, path), delimiter)
    return parse_text(_decode(raw, path), format=fmt, name=path.name)


def _require_format(path: Path) -> str:
    fmt = detect_format(path)
    if fmt is None:
        raise DocumentError(
            f"Unsupported file type: {path.name}",
            guidance="Supported extensions: " + ", ".join(sorted(SUPPORTED_EXTENSIONS)),
            path=str(path),
        )
    return fmt


def parse_text(text: str, *, format: str = "markdown", name: str = "") -> ParsedDocument:
    """Parse in-memory content (augmentation); `name` supplies the code language by extension."""
    text = _normalize_newlines(text)
    if format == "markdown":
        metadata, body, warnings = _split_front_matter(text, name)
        title = _first_str(metadata.get("title")) or _first_h1(body)
        first_line = text.count("\n", 0, len(text) - len(body)) + 1  # the body is a suffix of the text
        return ParsedDocument(text=body, format="markdown", title=title, metadata=metadata, warnings=warnings,
                              first_line=first_line)
    if format == "text":
        return ParsedDocument(text=text, format="text")
    if format == "code":
        return ParsedDocument(text=text, format="code", code_language=CODE_LANGUAGES.get(Path(name).suffix.lower()))
    if format == "html":
        try:
            return _parse_html(text, _Limits(name))
        except RecursionError as exc:  # our walk is iterative; this guards BeautifulSoup's own code
            raise DocumentError(f"{name or 'The HTML'} is nested too deeply to read",
                                guidance="Save the page as plain text or markdown and ingest that.") from exc
    raise DocumentError(
        f"Cannot parse in-memory content as {format!r}",
        guidance="Use one of: markdown, text, code, html (PDF and DOCX must be read from a file).",
    )


def _normalize_newlines(text: str) -> str:
    return text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _decode(raw: bytes, path: Path) -> str:
    """UTF-8, or UTF-16/32 with a byte order mark, or BOM-less UTF-16 that is mostly ASCII; else refused."""
    codec = next((c for bom, c in _BOMS if raw.startswith(bom)), None) or _sniff_utf16(raw)
    if codec is None and b"\x00" in raw[:_BINARY_SNIFF_BYTES]:
        raise _binary_error(path, "NUL bytes")
    try:
        text = raw.decode(codec or "utf-8")
    except UnicodeDecodeError as exc:
        if codec is not None:
            raise _binary_error(path, f"not valid {codec.upper()}") from exc
        raise DocumentError(
            f"{path.name} is not valid UTF-8 text (bad byte at offset {exc.start})",
            guidance="Convert the file to UTF-8 (e.g. `iconv -t UTF-8`).",
            path=str(path),
        ) from exc
    sample = text[:_BINARY_SNIFF_BYTES]
    if codec is not None and len(_CONTROL.findall(sample)) > len(sample) // 100:
        raise _binary_error(path, f"control characters once read as {codec.upper()}")
    return text


def _sniff_utf16(raw: bytes) -> str | None:
    """Windows tools write UTF-16 LE without a BOM; mostly-ASCII text then has a NUL in every other byte."""
    sample = raw[: _BINARY_SNIFF_BYTES & ~1]
    half = len(sample) // 2
    if half < 2:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    if odd >= 0.9 * half and even == 0:
        return "utf-16-le"
    if even >= 0.9 * half and odd == 0:
        return "utf-16-be"
    return None


def _binary_error(path: Path, why: str) -> DocumentError:
    return DocumentError(
        f"{path.name} looks binary ({why}), not text",
        guidance="Only text, markdown, code, PDF, HTML and DOCX files can be ingested.",
        path=str(path),
    )


def _split_front_matter(text: str, name: str) -> tuple[dict[str, Any], str, list[str]]:
    """Front matter, body and warnings. Front matter that does not parse is dropped with a warning and
    the body is still used: 7 of 55 real model-card files were skipped whole when it raised."""
    if not (text.startswith("---\n") or text.rstrip("\n") == "---"):
        return {}, text, []
    end = _FRONT_MATTER_END.search(text, 4)
    if end is None:
        return {}, text, []  # an opening rule with no close is a horizontal rule, not front matter
    body = text[end.end() :].lstrip("\n")
    try:
        data = _load_front_matter(text[4 : end.start()])
    except DocumentError as exc:
        warning = f"Front matter of {name or 'document'} ignored: {exc.message}"
        log.warning("%s", warning)
        return {}, body, [warning]
    if data is None:
        return {}, body, []
    if not isinstance(data, dict):
        return {}, text, []  # a `---` delimited paragraph that happens to parse as a YAML scalar
    return _clean_metadata(data), body, []


def _load_front_matter(source: str) -> Any:
    """yaml.safe_load, bounded in size and in nodes after aliases and merge keys are expanded."""
    import yaml

    if len(source) > MAX_FRONT_MATTER_BYTES:
        raise DocumentError(f"it is {len(source):,} characters, over the {MAX_FRONT_MATTER_BYTES:,} limit")
    try:
        loader = yaml.SafeLoader(source)
    except yaml.YAMLError as exc:  # its reader refuses control characters (`\x01`) before any parsing
        raise DocumentError(f"invalid YAML: {getattr(exc, 'problem', None) or str(exc).splitlines()[0]}") from exc
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_nodes(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        raise DocumentError(f"invalid YAML{line}: {getattr(exc, 'problem', None) or exc}") from exc
    except RecursionError as exc:
        raise DocumentError("invalid YAML: nested too deeply") from exc
    except (ValueError, TypeError, OverflowError) as exc:
        # A constructor, not the parser: `created: 2023-02-30` matches YAML's date pattern and then
        # datetime.date raises ValueError, which dropped the whole file (issue 17).
        raise DocumentError(f"invalid YAML: {str(exc)[:200]}") from exc
    finally:
        loader.dispose()


def _check_yaml_nodes(root: Any) -> None:
    """Count nodes and characters as construction would see them (an alias or merge counts again each
    time it is used), stopping at the limit: PyYAML copies merged keys, so `<<: [*a, ... 9 times]`
    nested 9 deep is 387M nodes."""
    import yaml

    seen, chars, stack = 0, 0, [root]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_FRONT_MATTER_NODES:
            raise DocumentError(f"it expands to more than {MAX_FRONT_MATTER_NODES:,} YAML nodes (aliases)")
        if isinstance(node, yaml.ScalarNode):
            chars += len(node.value)
            if chars > MAX_FRONT_MATTER_BYTES:  # one long string used many times through an alias
                raise DocumentError(f"it expands to more than {MAX_FRONT_MATTER_BYTES:,} characters (aliases)")
        elif isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in node.value for item in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _clean_metadata(data: dict) -> dict[str, Any]:
    # Metadata ends up in Chroma, which holds only scalars and lists of scalars.
    cleaned: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key).strip()
        if key.lower() in ("keywords", "tags"):
            value = _str_list(value)
        elif isinstance(value, (_dt.date, _dt.datetime)):
            value = value.isoformat()
        elif isinstance(value, (list, tuple, set)):
            value = [_scalar_str(v) for v in value if _is_scalar(v)]
        elif not isinstance(value, (str, int, float, bool)):
            continue
        if value is not None:
            cleaned[key] = value
    return cleaned


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, _dt.date)) and value is not None


def _scalar_str(value: Any) -> str:
    return value.isoformat() if isinstance(value, _dt.date) else str(value)


def _str_list(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple, set)) else []
    return [s for s in (_scalar_str(v).strip() for v in items if _is_scalar(v)) if s]


def _first_str(value: Any) -> str | None:
    return str(value).strip() or None if _is_scalar(value) else None


def _first_h1(markdown: str) -> str | None:
    fence: str | None = None
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end() :].strip():
                fence = None
        elif h1 := _H1.match(line.rstrip(" \t")):
            return strip_closing_hashes(h1.group(1)).strip() or None
    return None


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _escape_prose(text: str) -> str:
    return _MARKDOWN_LOOKALIKE.sub(r"\1\\\2", text)


def _fenced(code: str, language: str = "") -> str:
    fence = "```"
    while fence in code:
        fence += "`"
    return f"{fence}{language}\n{code.strip(chr(10))}\n{fence}"


def _markdown_table(rows: list[list[str]]) -> str:
    rows = [[_collapse(c).replace("|", "\\|") for c in row] for row in rows]
    rows = [row for row in rows if any(row)]
    if not rows:
        return ""
    width = max(len(row) for row in rows)
    lines = ["| " + " | ".join(row + [""] * (width - len(row))) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * width)
    return "\n".join(lines)


def _parse_notebook(path: Path, text: str, limits: _Limits) -> ParsedDocument:
    """A Jupyter notebook as Markdown: markdown cells as they are, code cells fenced in the kernel's language;
    outputs are dropped (images, tables and tracebacks are results, often large, rarely what a search wants)
    and so are raw cells. nbformat 4 and 3 (cells under `worksheets`, code under `input`)."""
    import json

    try:
        nb = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DocumentError(f"{path.name} is not a readable notebook (invalid JSON: {str(exc)[:200]})",
                            guidance="Open and save it in Jupyter, or export it as Markdown or a script.",
                            path=str(path)) from None
    cells = _notebook_cells(nb, path)
    language = _notebook_language(nb)
    blocks: list[str] = []
    for cell in cells:
        limits.tick()
        block = _notebook_cell(cell, language) if isinstance(cell, dict) else ""
        if block:
            limits.add_text(len(block))
            blocks.append(block)
    body = "\n\n".join(blocks)
    return ParsedDocument(text=body, format="notebook", title=_first_h1(body), code_language=language)


def _notebook_cells(nb: Any, path: Path) -> list[Any]:
    if isinstance(nb, dict) and isinstance(nb.get("cells"), list):
        return nb["cells"]
    if isinstance(nb, dict) and isinstance(nb.get("worksheets"), list):
        return [c for ws in nb["worksheets"] if isinstance(ws, dict) for c in ws.get("cells") or []]
    raise DocumentError(f"{path.name} is not a Jupyter notebook (no list of cells)",
                        guidance="Only .ipynb files saved by Jupyter (nbformat 3 or 4) are read.", path=str(path))


def _notebook_language(nb: dict[str, Any]) -> str:
    meta = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    for key, name in (("kernelspec", "language"), ("language_info", "name")):
        value = meta.get(key).get(name) if isinstance(meta.get(key), dict) else None
        if isinstance(value, str) and value.strip().isidentifier():
            return value.strip().lower()
    return "python"


def _notebook_cell(cell: dict[str, Any], language: str) -> str:
    source = cell.get("source", cell.get("input", ""))
    text = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
    if not isinstance(text, str) or not text.strip():
        return ""
    text = _normalize_newlines(text)
    kind = cell.get("cell_type")
    if kind == "markdown":
        return text.strip("\n")
    if kind == "code":
        return _fenced(text, language)
    if kind == "heading":  # nbformat 3
        level = cell.get("level") if isinstance(cell.get("level"), int) else 1
        return "#" * min(max(level, 1), 6) + " " + _collapse(text)
    return ""


def _parse_csv(path: Path, text: str, limits: _Limits, delimiter: str) -> ParsedDocument:
    """A CSV file as Markdown tables of CSV_ROWS_PER_TABLE rows, each opening with the header row. A field
    over the csv module's 128 KB limit or a NUL byte makes the file unreadable (skipped with the line)."""
    import csv

    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    blocks: list[str] = []
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    count = 0
    try:
        for row in reader:
            limits.tick()
            if not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = row
                continue
            count += 1
            rows.append((count, row))
            if len(rows) == CSV_ROWS_PER_TABLE:
                blocks.append(_rows_table(header, rows, limits))
    except csv.Error as exc:
        raise DocumentError(f"{path.name} is not readable CSV (line {reader.line_num}: {exc})",
                            guidance="Fix the quoting, or split out fields over 128 KB.", path=str(path)) from None
    if rows and header is not None:
        blocks.append(_rows_table(header, rows, limits))
    return ParsedDocument(text="\n\n".join(blocks), format="csv")


def _rows_table(header: list[str], rows: list[tuple[int, list[str]]], limits: _Limits) -> str:
    """One `## Rows a-b` section holding the header and `rows` (numbered; emptied) as a Markdown table."""
    block = f"## Rows {rows[0][0]}-{rows[-1][0]}\n\n" + _markdown_table([header, *(r for _, r in rows)])
    rows.clear()
    limits.add_text(len(block))
    return block


# -- Excel workbooks ---------------------------------------------------------------------------------------
#: An OLE compound file: what an encrypted (password-protected) .xlsx is, and a legacy .xls.
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_XLSX_GUIDANCE = "Open and re-save it in Excel or LibreOffice, or export its sheets as CSV and ingest those."
#: Leading one-cell rows of a sheet read as its caption (a title above the table), not as its header row.
_XLSX_CAPTION_ROWS = 3


def _parse_xlsx(path: Path, limits: _Limits, raw: bytes) -> ParsedDocument:
    """An Excel workbook as Markdown: each worksheet a `# name` section, its leading one-cell rows (a title
    above the table) as prose, then tables of CSV_ROWS_PER_TABLE rows under `## Rows a-b` headings numbered
    as the sheet numbers its rows, so a hit cites rows Excel shows. Values as Excel last computed them, never
    formulas (a formula Excel never computed reads as empty). Read-only mode streams each sheet; rows and
    cells are bounded (XLSX_MAX_ROWS, XLSX_MAX_CELLS) and the zip checked first, as for DOCX."""
    if raw.startswith(_OLE_MAGIC):
        raise DocumentError(f"{path.name} is encrypted (password-protected) or an old-style .xls named .xlsx",
                            guidance="Save a copy without a password as .xlsx (Excel: File > Save As), or export "
                                     "its sheets as CSV and ingest those.", path=str(path))
    _check_office_zip(path, limits, raw, "XLSX", MAX_XLSX_XML_BYTES, _XLSX_GUIDANCE)
    import openpyxl

    workbook = None
    try:
        workbook = openpyxl.load_workbook(io.BytesIO(raw), read_only=True, data_only=True)
        budget = _CellBudget(limits)
        blocks = [block for sheet in workbook.worksheets if (block := _xlsx_sheet(sheet, limits, budget))]
        title = _first_str(workbook.properties.title)
    except DocumentError:
        raise
    except Exception as exc:  # openpyxl raises zip, XML, key and value errors for damaged files
        raise DocumentError(f"{path.name} is not a readable XLSX file ({type(exc).__name__}: {str(exc)[:200]})",
                            guidance=_XLSX_GUIDANCE, path=str(path)) from None
    finally:
        if workbook is not None:
            workbook.close()
    return ParsedDocument(text="\n\n".join(blocks), format="xlsx", title=title)


class _CellBudget:
    """Rows and cells read from one workbook, refused past XLSX_MAX_ROWS or XLSX_MAX_CELLS."""

    def __init__(self, limits: _Limits) -> None:
        self.limits = limits
        self.rows = self.cells = 0

    def take(self, width: int) -> None:
        self.limits.tick()
        self.rows += 1
        self.cells += width
        if self.rows > XLSX_MAX_ROWS or self.cells > XLSX_MAX_CELLS:
            what = f"{XLSX_MAX_ROWS:,} rows" if self.rows > XLSX_MAX_ROWS else f"{XLSX_MAX_CELLS:,} cells"
            raise DocumentError(f"{self.limits.name} holds more than {what} (blank ones inside the sheets counted)",
                                guidance="Export the sheets you need as CSV and ingest those, or split the workbook.",
                                path=self.limits.path)


def _xlsx_sheet(sheet: Any, limits: _Limits, budget: _CellBudget) -> str:
    """One worksheet's Markdown section ("" when it holds no value): caption, then numbered tables."""
    sheet.reset_dimensions()  # the stored dimension may claim any size; read the rows the sheet holds
    captions: list[tuple[int, list[str]]] = []
    header: list[str] | None = None
    header_row = 0
    rows: list[tuple[int, list[str]]] = []
    blocks: list[str] = []
    for number, values in enumerate(sheet.iter_rows(values_only=True), start=1):
        budget.take(len(values))
        cells = [_xlsx_value(v) for v in values]
        filled = sum(1 for c in cells if c.strip())
        if not filled:
            continue
        if header is None and filled == 1 and len(captions) < _XLSX_CAPTION_ROWS:
            captions.append((number, cells))
            continue
        if header is None:  # a wider row is the header; a fourth one-cell row makes the captions a column
            header_row = number if filled > 1 else captions[0][0]
            header, rows = (cells, []) if filled > 1 else (captions[0][1], [*captions[1:], (number, cells)])
            captions = captions if filled > 1 else []
        else:
            rows.append((number, cells))
        if len(rows) >= CSV_ROWS_PER_TABLE:
            blocks.append(_rows_table(header, rows, limits))
    if header is None and captions:  # a one-column sheet of at most _XLSX_CAPTION_ROWS rows
        header, rows, captions = captions[0][1], captions[1:], []
    if rows and header is not None:
        blocks.append(_rows_table(header, rows, limits))
    elif header is not None and not blocks:  # one row of 2+ cells ("Total | 4242"): a one-row table, not nothing
        blocks.append(f"## Rows {header_row}-{header_row}\n\n" + _markdown_table([header]))
    if not blocks and not captions:
        return ""
    prose = [_escape_prose(_collapse(" ".join(c for c in cells if c))) for _, cells in captions]
    return "\n\n".join(["# " + _collapse(sheet.title), *prose, *blocks])


def _xlsx_value(value: Any) -> str:
    """A cell's value as text: dates as ISO dates (no 00:00:00), whole floats without `.0`, booleans as Excel
    shows them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, _dt.datetime):
        return value.date().isoformat() if value.time() == _dt.time() else value.isoformat(sep=" ")
    if isinstance(value, (_dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _parse_pdf(path: Path, limits: _Limits, raw: bytes) -> ParsedDocument:
    import pypdf

    try:
        with _pdf_stream_limits(pypdf):
            reader = pypdf.PdfReader(io.BytesIO(raw))
            _unlock_pdf(reader, path)
            pages = _pdf_pages(reader, limits)
            title = _first_str(reader.metadata.title) if reader.metadata else None
    except DocumentError:
        raise
    except Exception as exc:  # pypdf raises many types for damaged files; all mean "unreadable"
        raise DocumentError(
            f"{path.name} is not a readable PDF ({type(exc).__name__}: {exc})",
            guidance="Check that the file is a complete, valid PDF.",
            path=str(path),
        ) from exc
    if not pages:
        raise DocumentError(
            f"{path.name} has no extractable text (it may be a scanned image)",
            guidance="Run OCR on the PDF first, then ingest the result.",
            path=str(path),
        )
    return ParsedDocument(text="\n\n".join(t for _, t in pages), format="pdf", title=title, pages=pages)


def _pdf_stream_limits(pypdf: Any) -> Any:
    """pypdf's per-stream output limits, lowered to ours for this thread only (a context variable).
    Older pypdf has no apply_configuration and keeps its own defaults; our page and time limits still hold."""
    apply = getattr(pypdf, "apply_configuration", None)
    if apply is None:
        return nullcontext()
    current = pypdf.get_configuration()
    names = ("zlib_maximum_output_length", "lzw_maximum_output_length", "run_length_maximum_output_length",
             "brotli_maximum_output_length", "array_based_stream_maximum_output_length")
    return apply(**{n: min(getattr(current, n), MAX_PDF_STREAM_BYTES) for n in names if hasattr(current, n)})


def _unlock_pdf(reader: Any, path: Path) -> None:
    if not reader.is_encrypted:
        return
    try:
        # Many PDFs carry only an owner password; an empty user password opens them.
        opened = reader.decrypt("")
    except Exception:
        opened = 0
    if not opened:
        raise DocumentError(
            f"{path.name} is an encrypted (password-protected) PDF",
            guidance="Save an unencrypted copy of the PDF and ingest that.",
            path=str(path),
        )


def _pdf_pages(reader: Any, limits: _Limits) -> list[tuple[int, str]]:
    """Text per page, within the page, inflated-bytes, text and time limits."""
    count = len(reader.pages)
    if count > MAX_PDF_PAGES:
        raise DocumentError(
            f"{limits.name} has {count:,} pages, over the limit of {MAX_PDF_PAGES:,}",
            guidance="Split the PDF into parts (e.g. `qpdf --split-pages=500`) and ingest those.",
            path=limits.path,
        )
    pages = []
    for number, page in enumerate(reader.pages, start=1):
        limits.tick()
        contents = page.get_contents()  # decoded once here; pypdf caches it for extract_text
        limits.add_inflated(len(contents.get_data()) if contents is not None else 0)
        text = _clean_pdf_text(page.extract_text() or "")
        if text:
            limits.add_text(len(text))
            pages.append((number, text))
    return pages


def _clean_pdf_text(text: str) -> str:
    lines = [line.rstrip() for line in _normalize_newlines(text).split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _parse_docx(path: Path, limits: _Limits, raw: bytes) -> ParsedDocument:
    import docx

    _check_docx_zip(path, limits, raw)
    try:
        document = docx.Document(io.BytesIO(raw))
        title, blocks = _docx_blocks(document, limits)
    except DocumentError:
        raise
    except Exception as exc:  # python-docx raises zip, XML and key errors for damaged files
        raise DocumentError(
            f"{path.name} is not a readable DOCX file ({type(exc).__name__}: {exc})",
            guidance=_DOCX_GUIDANCE, path=str(path),
        ) from exc
    return ParsedDocument(text="\n\n".join(b for b in blocks if b), format="docx", title=title)


_DOCX_GUIDANCE = "Open and re-save the file in Word or LibreOffice, or export it as PDF."


def _check_docx_zip(path: Path, limits: _Limits, raw: bytes) -> None:
    _check_office_zip(path, limits, raw, "DOCX", MAX_DOCX_XML_BYTES, _DOCX_GUIDANCE)


def _check_office_zip(path: Path, limits: _Limits, raw: bytes, kind: str, max_xml: int, guidance: str) -> None:
    """Refuse a zip bomb before python-docx or openpyxl inflates it. The declared sizes can be trusted as a
    bound: zipfile never returns more than an entry's declared size (more fails its CRC check)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:  # the library would say the same, later
        raise DocumentError(f"{path.name} is not a readable {kind} file ({type(exc).__name__}: {exc})",
                            guidance=guidance, path=str(path)) from exc
    if len(entries) > MAX_ZIP_ENTRIES:
        raise DocumentError(
            f"{path.name} holds {len(entries):,} zip entries, over the limit of {MAX_ZIP_ENTRIES:,}",
            guidance=f"This is not an ordinary {kind} file; open and re-save it.", path=str(path),
        )
    xml = _xml_bytes(raw, entries)
    if xml > max_xml:
        raise DocumentError(
            f"{path.name} inflates to {xml / 2**20:.1f} MB of XML, over the {max_xml / 2**20:g} MB"
            " limit (a compression bomb, or a very long document)",
            guidance="Split the document, or export it to plain text, markdown or CSV and ingest that.",
            path=str(path),
        )
    limits.add_inflated(sum(e.file_size for e in entries))


#: Bytes read from each zip entry to tell XML from a picture or other binary part (BOM, whitespace, `<`).
_SNIFF_BYTES = 64
#: Byte-order marks an XML parser reads as the start of UTF-8, UTF-16 or UTF-32 text.
_XML_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff", b"\xff\xfe\x00\x00")


def _xml_bytes(raw: bytes, entries: list[zipfile.ZipInfo]) -> int:
    """Inflated size of every entry that may be XML, whatever its name: openpyxl and python-docx find parts
    through [Content_Types].xml and the .rels files, so 230 MB of shared strings stored as `xl/strings.bin`
    passed a count of `.xml`/`.rels` names and took 129 s and 1.39 GB (outside tester). Only entries whose
    first bytes cannot start an XML document (a PNG, JPEG, an OLE vbaProject.bin) are left out, so pictures
    do not count. Reading 64 bytes of an entry inflates one small block, at most MAX_ZIP_ENTRIES times."""
    total = 0
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for entry in entries:
            if entry.file_size == 0:
                continue
            try:
                with archive.open(entry) as handle:
                    head = handle.read(_SNIFF_BYTES)
            except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, RuntimeError, OSError):
                head = b"<"  # unreadable here: count it (the reader would fail on it later anyway)
            total += entry.file_size if _may_be_xml(head) else 0
    return total


def _may_be_xml(head: bytes) -> bool:
    """Whether an XML parser may read `head` as the start of a document: a BOM, UTF-16/32 `<`, EBCDIC `<?xm`
    (libxml2 detects it), or `<` after whitespace."""
    if head.startswith((*_XML_BOMS, b"\x4c\x6f\xa7\x94")) or b"\x00<" in head or b"<\x00" in head:
        return True
    return head.lstrip(b" \t\r\n").startswith(b"<")


def _docx_blocks(document: Any, limits: _Limits) -> tuple[str | None, list[str]]:
    """Markdown blocks for paragraphs, headings, lists and tables, within the text and time limits."""
    from docx.table import Table

    blocks: list[str] = []
    title = _first_str(document.core_properties.title)
    style_name = _docx_style_names(document)
    in_list = False
    for item in document.iter_inner_content():
        limits.tick()
        if isinstance(item, Table):
            blocks.append(_docx_table(item))
            limits.add_text(len(blocks[-1]))
            in_list = False
            continue
        text = item.text.strip()
        if not text:
            continue
        limits.add_text(len(text))
        style = style_name(item._p.style)
        level = _docx_heading_level(style)
        if level:
            blocks.append("#" * level + " " + _collapse(text))
            title = title or (_collapse(text) if level == 1 else None)
        elif style.lower().startswith("list"):
            # Consecutive list paragraphs stay one markdown list so they chunk together.
            if in_list:
                blocks[-1] += "\n- " + _collapse(text)
            else:
                blocks.append("- " + _collapse(text))
            in_list = True
            continue
        else:
            blocks.append(_escape_prose(text))
        in_list = False
    return title, blocks


def _docx_style_names(document: Any) -> Any:
    """Paragraph style id -> name, looked up once: python-docx's `paragraph.style` scans every style
    (164 in Word's template) for each unstyled paragraph, 1.5 ms each: 25,000 paragraphs took 45 s."""
    from docx.enum.style import WD_STYLE_TYPE

    names = {s.style_id: s.name or "" for s in document.styles}
    default = document.styles.default(WD_STYLE_TYPE.PARAGRAPH)
    fallback = (default.name or "") if default is not None else ""
    return lambda style_id: names.get(style_id, fallback) if style_id else fallback


def _docx_table(table: Any) -> str:
    """One markdown cell per <w:tc>: python-docx's row.cells repeats a cell once per grid column it
    spans, so one `w:gridSpan="100000000"` in a few bytes of XML would make 100M cell objects."""
    from docx.table import _Cell

    return _markdown_table([[_Cell(tc, table).text for tc in row._tr.tc_lst] for row in table.rows])


def _docx_heading_level(style: str) -> int:
    if style == "Title":
        return 1
    m = re.fullmatch(r"Heading (\d)", style)
    return min(int(m.group(1)), 6) if m else 0


_HTML_DROP = ["script", "style", "nav", "aside", "form", "noscript", "template", "svg", "iframe", "button"]
_HTML_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_HTML_BLOCKS = {
    "p", "div", "section", "article", "main", "body", "html", "figure", "figcaption", "details", "summary",
    "blockquote", "dl", "dt", "dd", "address", "fieldset", "header", "footer", "li", "hr", "br",
}


def _parse_html(html: str, limits: _Limits) -> ParsedDocument:
    from bs4 import BeautifulSoup

    _check_html_elements(html, limits)
    soup = BeautifulSoup(html, "lxml")
    title = _first_str(_collapse(soup.title.get_text())) if soup.title else None
    for tag in soup.find_all(_HTML_DROP):
        tag.decompose()
    # An article's own <header> usually holds its <h1>; only page-level headers and footers are chrome.
    for tag in soup.find_all(["header", "footer"]):
        if tag.find_parent(["article", "main"]) is None:
            tag.decompose()
    root = soup.find("main") or soup.find("article") or soup.body or soup
    if title is None and (h1 := soup.find("h1")):
        title = _first_str(_collapse(h1.get_text(" ")))
    return ParsedDocument(text=_html_to_markdown(root, limits), format="html", title=title)


class _ElementCounter:
    """An lxml parser target that only counts start tags: no tree, so no memory, at libxml2 speed."""

    def __init__(self) -> None:
        self.count = 0

    def start(self, tag: str, attrib: Any) -> None:
        self.count += 1

    def close(self) -> int:
        return self.count


def _check_html_elements(html: str, limits: _Limits) -> None:
    """Refuse a page BeautifulSoup cannot hold: it costs about 1 KB and 16 us per element."""
    from lxml import etree

    parser = etree.HTMLParser(target=_ElementCounter(), recover=True, no_network=True)
    try:
        parser.feed(html)
        count = parser.close()
    except etree.LxmlError:
        return  # BeautifulSoup recovers from what lxml refuses; the walk's limits still hold
    if count > MAX_HTML_ELEMENTS:
        raise DocumentError(
            f"{limits.name} has {count:,} HTML elements, over the limit of {MAX_HTML_ELEMENTS:,}",
            guidance="Split the page, or save it as plain text or markdown and ingest that.",
        )


def _html_to_markdown(root: Any, limits: _Limits) -> str:
    """Depth-first walk with an explicit stack: 1,000 nested <div>s overflowed the recursive version."""
    from bs4.element import NavigableString, PreformattedString, Tag

    blocks: list[str] = []
    inline: list[str] = []

    def flush() -> None:
        text = _collapse("".join(inline))
        inline.clear()
        if text:
            limits.add_text(len(text))
            blocks.append(_escape_prose(text))

    stack: list[tuple[Any, bool]] = [(iter(root.children), False)]  # (children left, flush when done)
    steps = 0
    while stack:
        child = next(stack[-1][0], None)
        if child is None:
            if stack.pop()[1]:
                flush()
            continue
        steps += 1
        if steps % 1000 == 1:
            limits.tick()
        if isinstance(child, NavigableString):
            if not isinstance(child, PreformattedString):  # comments, doctype, CDATA
                inline.append(str(child))
        elif isinstance(child, Tag) and not _html_leaf_block(child, blocks, inline, flush):
            is_block = child.name in _HTML_BLOCKS
            if is_block:
                flush()
            stack.append((iter(child.children), is_block))
    flush()
    return "\n\n".join(blocks)


def _html_leaf_block(tag: Any, blocks: list[str], inline: list[str], flush: Any) -> bool:
    """Render a heading, pre, table, list or inline code whole; False for a tag to walk into."""
    name = tag.name
    if name == "code":
        inline.append(f"`{tag.get_text()}`")
        return True
    if name not in _HTML_HEADINGS and name not in ("pre", "table", "ul", "ol"):
        return False
    flush()
    if name in _HTML_HEADINGS:
        if text := _collapse(tag.get_text(" ")):
            blocks.append("#" * _HTML_HEADINGS[name] + " " + text)
    elif name == "pre":
        if tag.get_text().strip():
            blocks.append(_fenced(tag.get_text(), _html_code_language(tag)))
    elif name == "table":
        rows = [[c.get_text(" ") for c in tr.find_all(["th", "td"])] for tr in tag.find_all("tr")]
        if table := _markdown_table(rows):
            blocks.append(table)
    else:
        items = [_collapse(li.get_text(" ")) for li in tag.find_all("li", recursive=False)]
        if items := [i for i in items if i]:
            blocks.append("\n".join("- " + i for i in items))
    return True


def _html_code_language(pre: Any) -> str:
    code = pre.find("code")
    for tag in (pre, code):
        for cls in (tag.get("class") or []) if tag is not None else []:
            for prefix in ("language-", "lang-"):
                if cls.startswith(prefix):
                    return cls[len(prefix) :]
    return ""
