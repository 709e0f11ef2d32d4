"""File readers: turn markdown, text, code, PDF, HTML and DOCX files into one ParsedDocument shape."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from research_agent.errors import DocumentError

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
_OTHER_FORMATS = {".pdf": "pdf", ".html": "html", ".htm": "html", ".docx": "docx"}
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset(
    MARKDOWN_EXTENSIONS | TEXT_EXTENSIONS | CODE_LANGUAGES.keys() | _OTHER_FORMATS.keys()
)

_BINARY_SNIFF_BYTES = 8192
_FRONT_MATTER_END = re.compile(r"^(?:---|\.\.\.)[ \t]*$", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_H1 = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
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
    fmt = detect_format(path)
    if fmt is None:
        raise DocumentError(
            f"Unsupported file type: {path.name}",
            guidance="Supported extensions: " + ", ".join(sorted(SUPPORTED_EXTENSIONS)),
            path=str(path),
        )
    try:
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise DocumentError(
                f"{path.name} is {size} bytes, over the {max_bytes}-byte limit",
                guidance="Raise the maximum file size setting or split the file.",
                path=str(path),
            )
        if fmt == "pdf":
            return _parse_pdf(path)
        if fmt == "docx":
            return _parse_docx(path)
        raw = path.read_bytes()
    except OSError as exc:
        raise DocumentError(
            f"Cannot read {path.name}: {exc.strerror or exc}", guidance="Check the file's permissions.", path=str(path)
        ) from exc
    return parse_text(_decode(raw, path), format=fmt, name=path.name)


def parse_text(text: str, *, format: str = "markdown", name: str = "") -> ParsedDocument:
    """Parse in-memory content (augmentation); `name` supplies the code language by extension."""
    text = _normalize_newlines(text)
    if format == "markdown":
        metadata, body = _split_front_matter(text, name)
        title = _first_str(metadata.get("title")) or _first_h1(body)
        return ParsedDocument(text=body, format="markdown", title=title, metadata=metadata)
    if format == "text":
        return ParsedDocument(text=text, format="text")
    if format == "code":
        return ParsedDocument(text=text, format="code", code_language=CODE_LANGUAGES.get(Path(name).suffix.lower()))
    if format == "html":
        return _parse_html(text)
    raise DocumentError(
        f"Cannot parse in-memory content as {format!r}",
        guidance="Use one of: markdown, text, code, html (PDF and DOCX must be read from a file).",
    )


def _normalize_newlines(text: str) -> str:
    return text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _decode(raw: bytes, path: Path) -> str:
    if b"\x00" in raw[:_BINARY_SNIFF_BYTES]:
        raise DocumentError(
            f"{path.name} looks binary (NUL bytes), not text",
            guidance="Only text, markdown, code, PDF, HTML and DOCX files can be ingested.",
            path=str(path),
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"{path.name} is not valid UTF-8 text (bad byte at offset {exc.start})",
            guidance="Convert the file to UTF-8 (e.g. `iconv -t UTF-8`).",
            path=str(path),
        ) from exc


def _split_front_matter(text: str, name: str) -> tuple[dict[str, Any], str]:
    if not (text.startswith("---\n") or text.rstrip("\n") == "---"):
        return {}, text
    end = _FRONT_MATTER_END.search(text, 4)
    if end is None:
        return {}, text  # an opening rule with no close is a horizontal rule, not front matter
    import yaml

    try:
        data = yaml.safe_load(text[4 : end.start()])
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        raise DocumentError(
            f"Invalid YAML front matter in {name or 'document'}{line}: {getattr(exc, 'problem', None) or exc}",
            guidance="Fix the YAML between the leading '---' lines, or remove it.",
            path=name or None,
        ) from exc
    body = text[end.end() :].lstrip("\n")
    if data is None:
        return {}, body
    if not isinstance(data, dict):
        return {}, text  # a `---` delimited paragraph that happens to parse as a YAML scalar
    return _clean_metadata(data), body


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
        elif h1 := _H1.match(line):
            return h1.group(1).strip() or None
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


def _parse_pdf(path: Path) -> ParsedDocument:
    import pypdf

    try:
        reader = pypdf.PdfReader(str(path))
        if reader.is_encrypted:
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
        pages = []
        for number, page in enumerate(reader.pages, start=1):
            text = _clean_pdf_text(page.extract_text() or "")
            if text:
                pages.append((number, text))
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


def _clean_pdf_text(text: str) -> str:
    lines = [line.rstrip() for line in _normalize_newlines(text).split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _parse_docx(path: Path) -> ParsedDocument:
    import docx
    from docx.table import Table

    try:
        document = docx.Document(str(path))
        blocks: list[str] = []
        title = _first_str(document.core_properties.title)
        in_list = False
        for item in document.iter_inner_content():
            if isinstance(item, Table):
                blocks.append(_markdown_table([[cell.text for cell in row.cells] for row in item.rows]))
                in_list = False
                continue
            text = item.text.strip()
            if not text:
                continue
            style = (item.style.name if item.style is not None else "") or ""
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
    except Exception as exc:  # python-docx raises zip, XML and key errors for damaged files
        raise DocumentError(
            f"{path.name} is not a readable DOCX file ({type(exc).__name__}: {exc})",
            guidance="Open and re-save the file in Word or LibreOffice, or export it as PDF.",
            path=str(path),
        ) from exc
    return ParsedDocument(text="\n\n".join(b for b in blocks if b), format="docx", title=title)


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


def _parse_html(html: str) -> ParsedDocument:
    from bs4 import BeautifulSoup

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
    return ParsedDocument(text=_html_to_markdown(root), format="html", title=title)


def _html_to_markdown(root: Any) -> str:
    from bs4.element import NavigableString, PreformattedString, Tag

    blocks: list[str] = []
    inline: list[str] = []

    def flush() -> None:
        text = _collapse("".join(inline))
        inline.clear()
        if text:
            blocks.append(_escape_prose(text))

    def walk(node: Tag) -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, PreformattedString):  # comments, doctype, CDATA
                    inline.append(str(child))
                continue
            if not isinstance(child, Tag):
                continue
            name = child.name
            if name in _HTML_HEADINGS:
                flush()
                if text := _collapse(child.get_text(" ")):
                    blocks.append("#" * _HTML_HEADINGS[name] + " " + text)
            elif name == "pre":
                flush()
                if child.get_text().strip():
                    blocks.append(_fenced(child.get_text(), _html_code_language(child)))
            elif name == "table":
                flush()
                rows = [[c.get_text(" ") for c in tr.find_all(["th", "td"])] for tr in child.find_all("tr")]
                if table := _markdown_table(rows):
                    blocks.append(table)
            elif name in ("ul", "ol"):
                flush()
                items = [_collapse(li.get_text(" ")) for li in child.find_all("li", recursive=False)]
                if items := [i for i in items if i]:
                    blocks.append("\n".join("- " + i for i in items))
            elif name == "code":
                inline.append(f"`{child.get_text()}`")
            elif name in _HTML_BLOCKS:
                flush()
                walk(child)
                flush()
            else:
                walk(child)

    walk(root)
    flush()
    return "\n\n".join(blocks)


def _html_code_language(pre: Any) -> str:
    code = pre.find("code")
    for tag in (pre, code):
        for cls in (tag.get("class") or []) if tag is not None else []:
            for prefix in ("language-", "lang-"):
                if cls.startswith(prefix):
                    return cls[len(prefix) :]
    return ""
