"""Reading what was ingested: the document list, one document's manifest, its text and its chunks.

Read-only, so it never takes the write lock; a document's visible chunks are the ids of the version its
manifest names (version_ids), so a reader never sees a half-written new version.

Reading by line (`get_document` with a range, issue 17): the text comes from the stored chunks only, placed on
their stored line ranges (`read_lines`); a line no chunk holds is `missing`, one given only approximately
`inexact`, never made up (docs/ingestion.md, "Chunks are bounded", has the measured rates).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.catalog.collections import open_collection
from research_agent.catalog.common import paginate
from research_agent.errors import DocumentError
from research_agent.ingest.prepare import document_key, version_ids
from research_agent.storage.chunks import records

if TYPE_CHECKING:
    from research_agent.container import Container


class DocumentInfo(BaseModel):
    document: str
    title: str
    kind: str
    chunk_count: int
    content_hash: str
    source: str
    path: str | None = None
    updated_at: str


class DocumentList(BaseModel):
    """One page of a collection's documents in key order (catalog/common.py `paginate`)."""

    collection: str
    documents: list[DocumentInfo]
    total: int
    next_cursor: str | None = None


def _document_info(manifest: dict[str, Any]) -> DocumentInfo:
    return DocumentInfo(**{k: manifest.get(k) for k in DocumentInfo.model_fields})


def list_documents(c: Container, collection: str, *, limit: int | None = None,
                   cursor: str | None = None) -> DocumentList:
    """One page (DEFAULT_PAGE by default) of the collection's documents, by key: 400 documents unpaged were
    258 KB of MCP structured content (issue 15)."""
    c.store.refresh()
    open_collection(c, collection, check_model=False)
    shown, page = paginate(list(c.store.registry_find("document", collection).values()), lambda m: m["document"],
                           f"documents:{collection}", _document_info, limit=limit, cursor=cursor)
    return DocumentList(collection=collection, documents=shown, **page.model_dump())


def find_document(c: Container, collection: str, document: str) -> dict[str, dict[str, Any]]:
    """The manifest of `document` (its key, a path that resolves to a recorded file, or a web page's URL
    spelt any way that normalises to its key: `https://host/./page#x` finds `url:https://host/page`, and a
    legacy-keyed page fetched from that URL). Never the page a URL once redirected to (web.same_page)."""
    key = document_key(collection, document)
    found = c.store.registry_get([key])
    if not found and _is_url(document):  # a page by any spelling of its URL (web.normalise)
        from research_agent.ingest.web import document_for, stored_pages

        found = stored_pages(c, collection, document_for(document[4:] if document[:4].lower() == "url:" else document))
    resolved = None if found or _is_url(document) else _as_path(document)
    if resolved is not None:
        found = {k: m for k, m in c.store.registry_find("document", collection).items()
                 if m.get("path") and m["path"] == resolved}
    if not found:
        raise DocumentError(f"Document {document[:200]!r} not found in {collection!r}",
                            guidance=f"Run `research-agent kb list-documents --collection {collection}`.",
                            document=document[:200], collection=collection)
    return found


def _is_url(document: str) -> bool:
    return document.lower().startswith(("http://", "https://", "url:http://", "url:https://"))


def _as_path(document: str) -> str | None:
    """`document` as an absolute path, or None when it cannot be one: `~nosuchuser` (RuntimeError from
    expanduser), a NUL byte or an over-long name (ValueError / OSError from resolve) match no file."""
    try:
        return str(Path(document).expanduser().resolve())
    except (RuntimeError, ValueError, OSError):
        return None


#: Keys an "ambiguous" error names: enough to show the `file#id` form without a wall of text.
AMBIGUOUS_SHOWN = 5


def find_one(c: Container, collection: str, document: str) -> dict[str, Any]:
    """The one manifest `document` names: a records file's path names all its records (`file#id` each), and
    reading an arbitrary one of them is wrong, so that is an "ambiguous" DocumentError listing a few keys."""
    found = find_document(c, collection, document)
    if len(found) == 1:
        return next(iter(found.values()))
    keys = sorted(m["document"] for m in found.values())
    shown = keys[:AMBIGUOUS_SHOWN]
    more = f" and {len(keys) - len(shown)} more" if len(keys) > len(shown) else ""
    raise DocumentError(f"{document[:200]!r} is ambiguous: it names {len(keys)} documents "
                        f"({', '.join(shown)}{more})", ambiguous=True, candidates=shown, collection=collection,
                        guidance=f"Name one record by its key, e.g. {shown[0]!r}; list them with "
                                 f"`research-agent kb list-documents --collection {collection}`.")


class DocumentLine(BaseModel):
    n: int
    text: str


class LineSpan(BaseModel):
    line_start: int
    line_end: int
    reason: str


class DocumentContent(BaseModel):
    """A document's text (`content`: its chunks joined by blank lines; for a line range, the range's lines) and
    its lines with their numbers (`read_lines`)."""

    collection: str
    document: str
    title: str
    kind: str
    source: str
    path: str | None = None
    updated_at: str
    content: str
    chunk_count: int
    #: "source": file line numbers (the submitted text's for research and notes), front matter counted;
    #: "text": the numbered lines of `content` (PDF, HTML, DOCX and chunks stored before line ranges).
    line_basis: str = "text"
    #: The last line the stored chunks reach (trailing blank lines of a file are not stored).
    total_lines: int = 0
    line_start: int = 0
    line_end: int = 0
    lines: list[DocumentLine] = []
    #: Lines of the range no stored chunk holds (they are not in `lines`), and lines shown but not exact.
    missing: list[LineSpan] = []
    inexact: list[LineSpan] = []
    notes: list[str] = []


class ChunkView(BaseModel):
    chunk_id: str
    sequence: int
    header_path: str
    content_type: str
    content: str
    #: The file lines the chunk comes from (1-based, inclusive; None where unknown) and its PDF page.
    line_start: int | None = None
    line_end: int | None = None
    page: int | None = None


class DocumentChunks(BaseModel):
    collection: str
    document: str
    title: str | None
    chunk_count: int
    chunks: list[ChunkView]


def _visible(c: Container, collection: str, manifest: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The (id, text, metadata) of the version `manifest` names, in document order."""
    col = open_collection(c, collection, check_model=False)
    got = records(col, ["documents", "metadatas"], ids=version_ids(collection, [manifest]))
    return sorted(got, key=lambda r: int(r[2].get("chunk_sequence_id", 0)))


def _current_chunks(c: Container, collection: str, document: str) -> tuple[dict[str, Any], list[ChunkView]]:
    """The manifest of `document` (key or file path) and its visible chunks, in document order."""
    c.store.refresh()
    manifest = find_one(c, collection, document)
    chunks = [ChunkView(chunk_id=cid, sequence=int(meta.get("chunk_sequence_id", 0)),
                        header_path=meta.get("header_path", ""), content_type=meta.get("content_type", ""),
                        content=text, line_start=meta.get("line_start"), line_end=meta.get("line_end"),
                        page=meta.get("page"))
              for cid, text, meta in _visible(c, collection, manifest)]
    return manifest, chunks


def _find_with_lines(c: Container, collection: str, document: str) -> tuple[dict[str, Any], str | None]:
    """The manifest of `document`, or of DOCUMENT when it reads DOCUMENT:10-20 / DOCUMENT:42 (a key holding
    such a suffix itself is found first), and the line spec the suffix gave."""
    try:
        return find_one(c, collection, document), None
    except DocumentError as exc:
        suffixed = _DOC_LINES.match(document)
        if suffixed is None or exc.data.get("ambiguous"):
            raise
        return find_one(c, collection, suffixed.group(1)), suffixed.group(2)


def get_document(c: Container, collection: str, document: str, *, line_start: int | None = None,
                 line_end: int | None = None) -> DocumentContent:
    """A document's text reassembled from its chunks in order (by key or file path), with numbered lines; a
    range (line_start..line_end, or DOCUMENT:10-20) returns those lines only (docs/cli.md, `kb get`)."""
    c.store.refresh()
    manifest, spec = _find_with_lines(c, collection, document)
    if spec is not None:
        if line_start is not None or line_end is not None:
            raise DocumentError(f"Lines given twice: {document[:200]!r} and line_start/line_end",
                                guidance="Give the range once: DOCUMENT:10-20 or line_start/line_end.")
        line_start, line_end = parse_line_range(spec)
    chunks = _visible(c, collection, manifest)
    text = read_lines([(t, m) for _, t, m in chunks])
    first, last, notes = _clip(text.total_lines, line_start, line_end, manifest["document"])
    ranged = line_start is not None or line_end is not None
    shown = [DocumentLine(n=n, text=text.lines[n]) for n in range(first, last + 1) if n in text.lines]
    return DocumentContent(
        collection=collection, document=manifest["document"], title=manifest["title"], kind=manifest["kind"],
        source=manifest["source"], path=manifest.get("path"), updated_at=manifest["updated_at"],
        chunk_count=len(chunks),
        content="\n".join(line.text for line in shown) if ranged else "\n\n".join(t for _, t, _ in chunks),
        line_basis=text.line_basis, total_lines=text.total_lines, line_start=first, line_end=last, lines=shown,
        missing=_spans((n for n in range(first, last + 1) if n not in text.lines), NOT_STORED),
        inexact=[span for numbers, reason in ((text.estimated, ESTIMATED), (text.joined, JOINED),
                                              (text.after_header, AFTER_HEADER))
                 for span in _spans(sorted(n for n in numbers if first <= n <= last), reason)],
        notes=notes + _basis_notes(text.line_basis, manifest))


def get_document_chunks(c: Container, collection: str, document: str) -> DocumentChunks:
    """A document's chunks in order, with their header paths and content types."""
    manifest, chunks = _current_chunks(c, collection, document)
    return DocumentChunks(collection=collection, document=manifest["document"], title=manifest.get("title"),
                          chunk_count=len(chunks), chunks=chunks)


# -- reading by line ----------------------------------------------------------------------------------------
#: The most characters of a line spec (`10-20`) read: a longer one is a mistake, never echoed whole.
LINE_SPEC_MAX_CHARS = 40
_LINE_SPEC = re.compile(r"\s*(\d+)\s*(?:(-)\s*(\d*)\s*)?")
#: DOCUMENT:SPEC where SPEC looks like a range (digits, dashes, spaces): `doc:-1` is then a bad range, not
#: "not found"; parse_line_range checks the spec.
_DOC_LINES = re.compile(r"^(.+):(-?\d[\d -]*)$")
_TABLE_RULE = re.compile(r"^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
NOT_STORED = "not stored: blank lines, front matter or markup no chunk keeps"
ESTIMATED = "placed by estimate: the chunk's text differs from these lines (markup the chunker dropped or added)"
JOINED = "one line split across chunks: its pieces are joined with a space"
AFTER_HEADER = "the chunker writes one blank line after a header: the file may hold markup there (node metadata)"
_HEADER = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
RANGE_GUIDANCE = "Give lines as N, N-M or N- (1-based, N <= M), e.g. `--lines 10-20` or DOCUMENT:10-20."


@dataclass
class LineText:
    """A document's lines as its stored chunks give them (`read_lines`)."""

    #: "source": the numbers are the file's lines (or the submitted text's, for research and notes), front
    #: matter counted; "text": the numbered lines of the chunks' text (PDF, HTML, DOCX, older stores).
    line_basis: str
    total_lines: int = 0
    lines: dict[int, str] = field(default_factory=dict)
    estimated: set[int] = field(default_factory=set)
    joined: set[int] = field(default_factory=set)
    after_header: set[int] = field(default_factory=set)


def parse_line_range(spec: str) -> tuple[int, int | None]:
    """`42` -> (42, 42), `10-20` -> (10, 20), `10-` -> (10, None); anything else is a DocumentError."""
    found = _LINE_SPEC.fullmatch(spec) if len(spec) <= LINE_SPEC_MAX_CHARS else None
    if found is None:
        raise DocumentError(f"{spec[:LINE_SPEC_MAX_CHARS]!r} is not a line range", guidance=RANGE_GUIDANCE)
    start = int(found.group(1))
    if found.group(2) is None:
        return start, start
    return start, int(found.group(3)) if found.group(3) else None


def _place_chunk(text: str, start: int | None, end: int | None,
                 continued: bool) -> tuple[dict[int, str], bool, bool]:
    """The file lines a chunk's text holds ({line: text}), whether that is an estimate, and whether the chunk
    closes a fence the file leaves open (the next chunk then repeats its opener).

    Most chunks are the file's lines one for one (all but split tables and fences on this repository's docs).
    A split table repeats its header row and rule, a split fence its markers: dropped, the rest is exact.
    Otherwise (hybrid metadata bullets dropped, blank runs collapsed, a blank added under a header) the first
    line goes to `start` and the rest is aligned on `end`, marked as an estimate."""
    lines = text.split("\n")
    if start is None or end is None or end < start:
        return {}, False, False
    for kept, closer_added in _without_repeats(lines, continued):
        if len(kept) == end - start + 1:
            return {start + i: line for i, line in enumerate(kept)}, False, closer_added
    placed = {start: lines[0]}
    for i, line in enumerate(reversed(lines[1:])):
        if end - i <= start:
            break
        placed[end - i] = line
    return placed, True, False


def _without_repeats(lines: list[str], continued: bool) -> list[tuple[list[str], bool]]:
    """The chunk's lines, then without what a split repeats (a table's header row and rule, a fence's markers),
    each with whether a closing fence was dropped. After a chunk that closed a fence the file leaves open
    (`continued`), an opening fence is a repeat: tried first."""
    out = [(lines, False)]
    if len(lines) > 2 and _TABLE_RULE.match(lines[1]) and lines[0].lstrip().startswith("|"):
        out.append((lines[2:], False))
    if len(lines) < 2:
        return out
    opens, closes = _FENCE.match(lines[0]) is not None, _FENCE.match(lines[-1]) is not None
    both = [(lines[1:-1], True)] if opens and closes and len(lines) > 2 else []
    opener = [(lines[1:], False)] if opens else []
    closer = [(lines[:-1], True)] if closes else []
    # Without a fence left open by the previous chunk, an opener is the file's own: never dropped.
    return out + (both + opener + closer if continued else closer)


def _merge_line(old: str, new: str) -> tuple[str, bool]:
    """One line two chunks claim: the longer when one holds the other (an overlap repeats the end of the
    previous chunk), else the pieces joined by a space, dropping the words the second repeats (joined=True)."""
    if new in old:
        return old, False
    if old in new:
        return new, False
    a, b = old.split(), new.split()
    shared = next((k for k in range(min(len(a), len(b)), 0, -1) if a[-k:] == b[:k]), 0)
    return " ".join([old.rstrip(), *b[shared:]]) if b[shared:] else old, True


def read_lines(chunks: list[tuple[str, dict[str, Any]]]) -> LineText:
    """A document's lines from its chunks (text, metadata) in order: placed on the stored line ranges when
    every chunk has one, else the numbered lines of the chunks' text joined by blank lines."""
    if not chunks:
        return LineText("text")
    if any(not isinstance(m.get("line_start"), int) for _, m in chunks):
        text = "\n\n".join(t for t, _ in chunks).split("\n")
        return LineText("text", total_lines=len(text), lines=dict(enumerate(text, start=1)))
    out = LineText("source")
    continued = False
    for text, meta in chunks:
        placed, estimate, continued = _place_chunk(text, meta.get("line_start"), meta.get("line_end"), continued)
        for n, line in placed.items():
            if n in out.lines:
                out.lines[n], joined = _merge_line(out.lines[n], line)
                if joined:
                    out.joined.add(n)
            else:
                out.lines[n] = line
                if estimate:
                    out.estimated.add(n)
                elif line == "" and _HEADER.match(placed.get(n - 1, "x")):
                    out.after_header.add(n)
        out.total_lines = max(out.total_lines, int(meta.get("line_end") or 0))
    return out


def _clip(total: int, start: int | None, end: int | None, document: str) -> tuple[int, int, list[str]]:
    """The range to show, from 1..total by default: 0, a reversed range or a start past the end is a DocumentError;
    an end past the end is clipped with a note (an agent asking for 40-80 of a 60-line file gets 40-60)."""
    if start is None and end is None:
        return min(1, total), total, []
    start = 1 if start is None else start
    if start < 1 or (end is not None and end < 1):
        raise DocumentError("Line numbers start at 1", guidance=RANGE_GUIDANCE, total_lines=total)
    if end is not None and end < start:
        raise DocumentError(f"Lines {start}-{end} are reversed", guidance=RANGE_GUIDANCE, total_lines=total)
    if start > total:
        raise DocumentError(f"Line {start} is past the end of {document[:200]!r}, which has {total} lines",
                            guidance=f"Ask for lines 1-{total}." if total else "The document has no stored lines.",
                            total_lines=total)
    if end is not None and end <= total:
        return start, end, []
    return start, total, [f"lines {start}-{end} asked: the document ends at line {total}"] if end else []


def _spans(numbers: Any, reason: str) -> list[LineSpan]:
    """Runs of consecutive line numbers (ascending) as spans."""
    out: list[LineSpan] = []
    for n in numbers:
        if out and out[-1].line_end == n - 1:
            out[-1].line_end = n
        else:
            out.append(LineSpan(line_start=n, line_end=n, reason=reason))
    return out


def _basis_notes(basis: str, manifest: dict[str, Any]) -> list[str]:
    if basis == "text":
        return ["line numbers count lines of the stored text: this format's text is not the file's (PDF chunks "
                "carry their page in the query results)"]
    if not manifest.get("path"):
        return [f"a {manifest.get('kind', 'research')} has no file: line numbers are those of its stored text"]
    return []
