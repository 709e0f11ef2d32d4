"""Header-aware chunker, including the Markdown-JSON hybrid node format (metadata bullets under headers).

Token estimate: one token per word or digit run, per punctuation mark and per underscore, plus one more
per 8 characters of a long run. That tracks WordPiece/BPE counts (common words whole, long identifiers
split) within ~20 % on English prose and code, with no tokenizer import.

Node ids: the `id` metadata field when given; otherwise "n-" + sha1(source + "\\n" + header_path)[:12],
with "\\n" + occurrence number appended to the hashed string for the 2nd, 3rd ... header with the same
path, so ids are stable across re-ingests and unique within a document.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from research_agent.parsing import ParsedDocument

_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_")
_HEADER = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_FENCE_CLOSE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*$")
_TABLE_SEPARATOR = re.compile(r"^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_CONTENT_SEPARATOR = re.compile(r"^[ \t]*<!--[ \t]*content[ \t]*-->[ \t]*$", re.IGNORECASE)
_META_BULLET = re.compile(r"^ {0,3}[-*+][ \t]+[*_`]*([A-Za-z][\w-]*)[*_`]*[ \t]*:(?:[ \t]+(.*?))?[ \t]*$")
_LIST_CONTINUATION = re.compile(r"^([ \t]+\S|[ \t]{0,3}([-*+]|\d+[.)])[ \t])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CODE_SYMBOL = re.compile(
    r"^(?:export\s+|pub(?:\([^)]*\))?\s+|public\s+|private\s+|protected\s+|static\s+|async\s+|default\s+)*"
    r"(?:def|class|function\*?|func|fn|struct|interface|enum|trait|impl|type|module|object)\s+"
    r"(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)"
)

#: Keys that mark a bullet block under a header as node metadata even without a `<!-- content -->` line.
KNOWN_METADATA_KEYS = frozenset(
    {"id", "type", "status", "blocked_by", "blocks", "depends_on", "last_checked", "label", "labels", "priority",
     "parent", "parent_id"}
)
# Without a separator these must be short (an `id` one token) so an API field list such as
# "- id: the user's id" stays prose.
_TOKEN_VALUED_KEYS = frozenset({"id", "type", "status", "last_checked", "priority", "parent", "parent_id"})
_LIST_KEYS = frozenset({"blocked_by", "blocks", "depends_on", "label", "labels", "tags"})
_EMPTY_VALUES = frozenset({"", "none", "null", "~", "-", "[]"})


@dataclass
class Chunk:
    """One retrievable piece of a document with its place in the header tree and its node fields."""

    text: str
    header_path: str
    content_type: str
    code_language: str | None
    node_id: str
    node_type: str | None
    status: str | None
    parent_id: str | None
    blocked_by: list[str]
    last_checked: str | None
    labels: list[str]
    anchor: str
    page: int | None
    token_count: int
    #: Other hybrid-format metadata of the node (title, description, priority ...), scalars or lists of str.
    node_metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Node:
    id: str
    type: str | None = None
    status: str | None = None
    parent_id: str | None = None
    blocked_by: list[str] = field(default_factory=list)
    last_checked: str | None = None
    labels: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Section:
    level: int  # 0 for text before the first header
    title: str
    header_line: str
    items: list[tuple[str, Any]] = field(default_factory=list)  # ("line", str) | ("fence", (lang, text, inner))


def estimate_tokens(text: str) -> int:
    """Approximate subword-token count of `text` (see the module docstring for the rule)."""
    return sum(1 + (len(piece) - 1) // 8 for piece in _TOKEN.findall(text))


def slugify(header: str) -> str:
    """GitHub-style anchor for a header: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", header)  # links and images render as their text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def chunk_document(
    doc: ParsedDocument, *, source: str, max_tokens: int = 350, overlap_tokens: int = 0
) -> list[Chunk]:
    """Split a parsed document into chunks of about `max_tokens`; code blocks and tables stay whole."""
    chunker = _Chunker(source, max(1, max_tokens), max(0, min(overlap_tokens, max_tokens // 2)))
    if doc.format == "pdf" and doc.pages:
        for number, text in doc.pages:
            chunker.prose(text, header_path=f"Page {number}", node=chunker.node(f"Page {number}"), page=number)
    elif doc.format == "text":
        chunker.prose(doc.text, header_path="", node=chunker.node(""))
    elif doc.format == "code":
        chunker.code(doc.text, doc.code_language)
    else:
        chunker.markdown(doc.text, doc.metadata)
    return chunker.chunks


class _Chunker:
    def __init__(self, source: str, max_tokens: int, overlap_tokens: int) -> None:
        self.source = source
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self.chunks: list[Chunk] = []
        self._path_counts: dict[str, int] = {}
        self._anchor_counts: dict[str, int] = {}

    def node(self, header_path: str, meta: dict[str, Any] | None = None, parent_id: str | None = None) -> _Node:
        occurrence = self._path_counts.get(header_path, 0) + 1
        self._path_counts[header_path] = occurrence
        meta = dict(meta or {})
        node_id = _scalar(meta.pop("id", None))
        if not node_id:
            key = self.source + "\n" + header_path + (f"\n{occurrence}" if occurrence > 1 else "")
            node_id = "n-" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:12]
        explicit_parent = _scalar(meta.pop("parent_id", None)) or _scalar(meta.pop("parent", None))
        return _Node(
            id=node_id,
            type=_scalar(meta.pop("type", None)),
            status=_scalar(meta.pop("status", None)),
            parent_id=explicit_parent or parent_id,
            blocked_by=_as_list(meta.pop("blocked_by", [])),
            last_checked=_scalar(meta.pop("last_checked", None)),
            labels=_as_list(meta.pop("labels", [])) + _as_list(meta.pop("label", [])),
            extra=meta,
        )

    def anchor(self, title: str) -> str:
        slug = slugify(title)
        seen = self._anchor_counts.get(slug, 0)
        self._anchor_counts[slug] = seen + 1
        return f"{slug}-{seen}" if seen else slug  # GitHub numbers repeated anchors the same way

    def emit(self, text: str, *, header_path: str, content_type: str, language: str | None, node: _Node,
             anchor: str = "", page: int | None = None) -> None:
        text = text.strip("\n")
        if not text.strip():
            return
        self.chunks.append(Chunk(
            text=text, header_path=header_path, content_type=content_type, code_language=language,
            node_id=node.id, node_type=node.type, status=node.status, parent_id=node.parent_id,
            blocked_by=list(node.blocked_by), last_checked=node.last_checked, labels=list(node.labels),
            anchor=anchor, page=page, token_count=estimate_tokens(text), node_metadata=dict(node.extra),
        ))

    # -- plain text and PDF pages ------------------------------------------------------------------

    def prose(self, text: str, *, header_path: str, node: _Node, page: int | None = None,
              anchor: str = "", lead: str = "") -> None:
        """Pack blank-line separated paragraphs; `lead` (the section header) opens the first chunk."""
        paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
        for piece in self._pack(paragraphs, lead):
            self.emit(piece, header_path=header_path, content_type="prose", language=None, node=node,
                      anchor=anchor, page=page)

    def _pack(self, paragraphs: list[str], lead: str = "") -> list[str]:
        pieces: list[str] = []
        current: list[str] = [lead] if lead else []
        size = estimate_tokens(lead)
        for paragraph in paragraphs:
            for part in self._fit(paragraph):
                part_size = estimate_tokens(part)
                if current and size + part_size > self.max_tokens and not (len(current) == 1 and current[0] == lead):
                    pieces.append("\n\n".join(current))
                    tail = _tail(pieces[-1], self.overlap_tokens)
                    current, size = ([tail], estimate_tokens(tail)) if tail else ([], 0)
                current.append(part)
                size += part_size
        if current and current != [lead]:
            pieces.append("\n\n".join(current))
        elif lead:
            pieces.append(lead)
        return pieces

    def _fit(self, text: str) -> list[str]:
        """Split one paragraph into parts under max_tokens: by sentence, then by line, then by words."""
        if estimate_tokens(text) <= self.max_tokens:
            return [text]
        for splitter, joiner in ((_SENTENCE_END, " "), (re.compile(r"\n"), "\n")):
            parts = [p for p in splitter.split(text) if p.strip()]
            if len(parts) > 1:
                out: list[str] = []
                last_size = 0
                for part in parts:
                    for sub in self._fit(part):
                        sub_size = estimate_tokens(sub)
                        if out and last_size + sub_size <= self.max_tokens:
                            out[-1] += joiner + sub
                            last_size += sub_size
                        else:
                            out.append(sub)
                            last_size = sub_size
                return out
        # Token counts add up across whitespace, so running sums stay exact and linear.
        out, current, size = [], [], 0
        for word in text.split():
            word_size = estimate_tokens(word)
            if current and size + word_size > self.max_tokens:
                out.append(" ".join(current))
                current, size = [], 0
            current.append(word)
            size += word_size
        if current:
            out.append(" ".join(current))
        return out

    # -- source code -------------------------------------------------------------------------------

    def code(self, text: str, language: str | None) -> None:
        node = self.node("")
        units: list[list[str]] = [[]]
        lines = text.split("\n")
        for i, line in enumerate(lines):
            # A blank line followed by a column-0 line (not a closing bracket) ends a top-level block.
            if not line.strip() and i + 1 < len(lines) and lines[i + 1][:1] not in ("", " ", "\t", "}", ")", "]"):
                units.append([])
                continue
            units[-1].append(line)
        blocks = ["\n".join(u).strip("\n") for u in units if "".join(u).strip()]
        current: list[str] = []
        size = 0
        for block in blocks:
            for part in self._fit_code(block):
                part_size = estimate_tokens(part)
                if current and size + part_size > self.max_tokens:
                    self._emit_code(current, language, node)
                    current, size = [], 0
                current.append(part)
                size += part_size
        if current:
            self._emit_code(current, language, node)

    def _fit_code(self, block: str) -> list[str]:
        if estimate_tokens(block) <= self.max_tokens:
            return [block]
        parts: list[str] = []
        size = 0
        for line in block.split("\n"):
            line_size = estimate_tokens(line)
            if parts and size + line_size <= self.max_tokens:
                parts[-1] += "\n" + line
                size += line_size
            else:
                parts.append(line)
                size = line_size
        return [p for p in parts if p.strip()]

    def _emit_code(self, blocks: list[str], language: str | None, node: _Node) -> None:
        # The chunk is named after the definition it opens with, skipping decorators and comments.
        first = next((line for line in blocks[0].split("\n")
                      if line.strip() and not line.lstrip().startswith(("@", "#", "//", "/*", "*"))), "")
        symbol = _CODE_SYMBOL.match(first)
        self.emit("\n\n".join(blocks), header_path=symbol.group(1) if symbol else "", content_type="code_block",
                  language=language, node=node)

    # -- markdown (also HTML and DOCX, which the parser converts to markdown) ----------------------

    def markdown(self, text: str, front_matter: dict[str, Any]) -> None:
        sections = _sections(text)
        stack: list[tuple[int, str, _Node]] = []  # (level, title, node) of enclosing headers
        doc_node: _Node | None = None
        for section in sections:
            meta, items = _take_metadata(section.items)
            if section.level == 0:
                doc_meta = {k.lower(): v for k, v in front_matter.items() if k.lower() in ("id", "type", "status")}
                declared = meta is not None or bool(doc_meta)
                node = self.node("", {**doc_meta, **(meta or {})})
                # Only a document that declares itself a node becomes the parent of its top-level headers.
                doc_node = node if declared else None
                header_path, anchor = "", ""
            else:
                while stack and stack[-1][0] >= section.level:
                    stack.pop()
                header_path = " > ".join(t for t in [s[1] for s in stack] + [section.title] if t)
                parent = stack[-1][2].id if stack else (doc_node.id if doc_node else None)
                node = self.node(header_path, meta, parent)
                stack.append((section.level, section.title, node))
                anchor = self.anchor(section.title)
            before = len(self.chunks)
            self._section_body(items, section.header_line, header_path, node, anchor)
            if len(self.chunks) == before and meta is not None and section.header_line:
                # A node with metadata but no content must still exist in the store for dependency queries.
                self.emit(section.header_line, header_path=header_path, content_type="prose", language=None,
                          node=node, anchor=anchor)

    def _section_body(self, items: list[tuple[str, Any]], header_line: str, header_path: str, node: _Node,
                      anchor: str) -> None:
        lead = header_line
        prose_lines: list[str] = []
        kw = {"header_path": header_path, "node": node, "anchor": anchor}

        def flush_prose() -> None:
            nonlocal lead
            text = "\n".join(prose_lines)
            prose_lines.clear()
            if text.strip():
                self.prose(text, lead=lead, **kw)
                lead = ""

        def whole_block(text: str, content_type: str, language: str | None) -> None:
            nonlocal lead
            flush_prose()
            self.emit(f"{lead}\n\n{text}" if lead else text, content_type=content_type, language=language, **kw)
            lead = ""

        i = 0
        while i < len(items):
            kind, value = items[i]
            if kind == "fence":
                language, fenced, inner = value
                if inner.strip():
                    whole_block(fenced, "code_block", language)
                i += 1
            elif (i + 1 < len(items) and "|" in value and value.strip() and items[i + 1][0] == "line"
                  and "|" in items[i + 1][1] and _TABLE_SEPARATOR.match(items[i + 1][1])):
                end = i + 2
                while end < len(items) and items[end][0] == "line" and "|" in items[end][1] and items[end][1].strip():
                    end += 1
                whole_block("\n".join(v for _, v in items[i:end]), "table", None)
                i = end
            else:
                if not _CONTENT_SEPARATOR.match(value):  # stray separators are markup, not content
                    prose_lines.append(value)
                i += 1
        flush_prose()


def _sections(text: str) -> list[_Section]:
    """Split markdown into header sections; headers inside fenced code are content, not sections."""
    sections = [_Section(0, "", "")]
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE_OPEN.match(line)
        if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
            marker, start = fence.group(1), i
            i += 1
            while i < len(lines):
                close = _FENCE_CLOSE.match(lines[i])
                if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
                    break
                i += 1
            inner = "\n".join(lines[start + 1 : i])
            fenced = "\n".join(lines[start : i + 1])
            if i >= len(lines):  # an unclosed fence runs to the end of the file; close it for the chunk
                fenced += "\n" + marker
            language = (fence.group(2).strip().split() or [""])[0].strip("{}.").lower() or None
            sections[-1].items.append(("fence", (language, fenced, inner)))
            i += 1
            continue
        header = _HEADER.match(line)
        if header:
            sections.append(_Section(len(header.group(1)), (header.group(2) or "").strip(), line.strip()))
        else:
            sections[-1].items.append(("line", line))
        i += 1
    return sections


def _take_metadata(items: list[tuple[str, Any]]) -> tuple[dict[str, Any] | None, list[tuple[str, Any]]]:
    """Remove leading hybrid-format metadata bullets (and `<!-- content -->`) from a section's items."""
    meta: dict[str, Any] = {}
    found = seen_separator = False
    i, n = 0, len(items)

    def skip_blank(j: int) -> int:
        while j < n and items[j][0] == "line" and not items[j][1].strip():
            j += 1
        return j

    while True:
        j = skip_blank(i)
        if j < n and items[j][0] == "line" and _CONTENT_SEPARATOR.match(items[j][1]):
            i, seen_separator = j + 1, True
            continue
        k, run = j, []
        while k < n and items[k][0] == "line" and (m := _META_BULLET.match(items[k][1])):
            run.append((m.group(1).lower().replace("-", "_"), m.group(2) or ""))
            k += 1
        if not run or (k < n and items[k][0] == "line" and _LIST_CONTINUATION.match(items[k][1])):
            break  # no bullets, or an ordinary list that goes on with non key-value items
        after = skip_blank(k)
        separated = after < n and items[after][0] == "line" and bool(_CONTENT_SEPARATOR.match(items[after][1]))
        if not separated and (seen_separator or not _looks_like_metadata(run)):
            break
        for key, value in run:  # duplicate keys and repeated blocks: the last value wins
            meta[key] = _parse_value(key, value)
        found = True
        i = after + 1 if separated else k
        seen_separator = seen_separator or separated
    return (meta if found else None), items[i:]


def _looks_like_metadata(run: list[tuple[str, str]]) -> bool:
    keys = {key for key, _ in run}
    if not keys & KNOWN_METADATA_KEYS:
        return False
    values = {key: value.strip() for key, value in run}
    if "id" in values and not re.fullmatch(r"[\w.:/#@+\-'\"`]+", values["id"]):
        return False
    return all(len(values[k].split()) <= 2 for k in _TOKEN_VALUED_KEYS & keys)


def _parse_value(key: str, value: str) -> Any:
    value = value.strip()
    if key in _LIST_KEYS or (value.startswith("[") and value.endswith("]")):
        return _as_list(value)
    return _unquote(value)


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        return value[1:-1].strip()
    return value


def _as_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    value = str(value or "").strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    items = (_unquote(v) for v in value.split(","))
    return [v for v in items if v.lower() not in _EMPTY_VALUES]


def _scalar(value: Any) -> str | None:
    if isinstance(value, list):
        value = ", ".join(value)
    text = str(value).strip() if value is not None else ""
    return text or None


def _tail(text: str, tokens: int) -> str:
    """The last words of `text` worth at most `tokens` tokens, repeated at the start of the next chunk."""
    if tokens <= 0:
        return ""
    words = text.split()
    taken: list[str] = []
    while words and estimate_tokens(" ".join([words[-1]] + taken)) <= tokens:
        taken.insert(0, words.pop())
    return " ".join(taken)
