"""From a path to a PreparedDocument: the path policy, document keys and chunk ids, parse and chunk, and
the metadata each stored chunk carries (what service.py writes and search/keyword_index.py and discovery read back).

Nothing here writes: a crash before write_documents leaves the store as it was.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from research_agent.errors import DocumentError
from research_agent.ingest import folder
from research_agent.ingest.nodes import to_metadata
from research_agent.storage.registry import (  # noqa: F401 - re-exported by ingest
    chunk_ids,
    document_key,
    version_ids,
)

if TYPE_CHECKING:
    from research_agent.container import Container


@dataclass
class PreparedDocument:
    """A parsed and chunked document ready to embed and write."""

    document: str            # the key within the collection: a relative path, or research:<hash>
    title: str
    kind: str                # document | research | note
    source: str              # where it came from (path, URL, citation)
    content_hash: str
    chunks: list[Any]        # research_agent.ingest.chunking.Chunk
    path: str | None = None  # absolute file path, for prune and watch
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what the reader worked around (bad front matter...)


def content_hash(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


# -- paths ------------------------------------------------------------------------------------
def check_allowed(path: Path, allowed_roots: list[Path] | None) -> Path:
    """Resolve `path` (symlinks too) and refuse anything outside the allowed roots."""
    raw = str(path)
    if "\x00" in raw:
        raise DocumentError("Path contains a NUL byte", guidance="Pass a plain file or folder path.")
    try:
        resolved = path.expanduser().resolve()
        resolved.exists()  # ENAMETOOLONG and friends surface here, not later
    except (OSError, RuntimeError, ValueError) as exc:
        raise DocumentError(f"Unusable path: {_path_problem(exc)}",
                            guidance="Pass an existing file or folder path.", path=folder.display(raw[:200])) from None
    if allowed_roots is not None and not any(resolved == r or r in resolved.parents for r in allowed_roots):
        raise DocumentError(
            "Path is outside the allowed roots",
            guidance="Use a path under the server's allowed roots (RESEARCH_AGENT_ALLOWED_ROOTS).",
            path=folder.display(raw[:200]),
        )
    return resolved


def require_existing(path: Path, allowed_roots: list[Path] | None) -> Path:
    """`check_allowed`, and the path must exist: what `--create` (CLI) and `create` (MCP) check before they create a
    collection, so a typo leaves no empty collection behind."""
    target = check_allowed(path, allowed_roots)
    if not target.exists():
        raise DocumentError(f"No such file or folder: {folder.display(str(path)[:200])}",
                            path=folder.display(str(path)[:200]), guidance="Check the path; no collection was created.")
    return target


def _path_problem(exc: Exception) -> str:
    """Why a path could not be resolved, in words: Path.resolve reports a symlink loop as a bare RuntimeError
    before Python 3.13 (the message was "Unusable path: RuntimeError") and as ELOOP after."""
    if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP:
        return "symlink loop"
    return getattr(exc, "strerror", None) or type(exc).__name__


def source_name(path: Path, root: Path | None, prefix: str | None = None) -> str:
    """The document key: relative to the ingested folder's parent (so `docs/a.md`), or to cwd.

    `prefix` replaces the folder's own name when folder.folder_prefix gave it another (same-named folders).
    """
    if root is not None and prefix is not None:
        rel = path.relative_to(root).as_posix()
        return prefix if rel == "." else f"{prefix}/{rel}"
    base = root.parent if root is not None else Path.cwd()
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def iter_folder(folder_path: Path, *, recursive: bool, include: Iterable[str], exclude: Iterable[str],
                allowed_roots: list[Path] | None) -> list[Path]:
    """Regular files under `folder_path` (folder.walk_folder has the entries skipped and why)."""
    return folder.walk_folder(folder_path, recursive=recursive, include=include, exclude=exclude,
                              allowed_roots=allowed_roots).files


# -- preparing --------------------------------------------------------------------------------
def check_size(c: Container, path: Path) -> int:
    """Refuse a special file or one over its size limit before reading a byte; returns the limit in bytes.

    The stat comes first so a FIFO or device is never even opened; read_regular_file checks again on the
    open descriptor and counts the bytes it reads (st_size is 0 for /dev/zero and /proc files).
    """
    from research_agent.ingest.parsing import detect_format

    limit = int((c.settings.max_pdf_mb if detect_format(path) == "pdf" else c.settings.max_file_mb) * 1024 * 1024)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise folder.not_regular(path, st.st_mode)
    if st.st_size > limit:
        raise folder.too_large(f"{st.st_size / 2**20:.1f} MB", limit)
    return limit


def chunk_parsed(c: Container, parsed: Any, document: str, title: str) -> list[Any]:
    """Chunks of a parsed document, each fitting the embedder's own token limit with its title line (see
    chunking.chunk_document): sized by an estimate, 58 % of SciFact's chunks overflowed MiniLM's 256 tokens."""
    from research_agent.embeddings import chunk_limits
    from research_agent.ingest.chunking import chunk_document

    return chunk_document(parsed, source=document, title=title, **chunk_limits(c.embedder, c.settings.chunk_max_tokens))


def prepare_file(
    c: Container, path: Path, document: str, *, title: str | None = None, raw: bytes | None = None
) -> PreparedDocument:
    """Parse and chunk one file (DocumentError when it cannot be used; OSError when it cannot be read).

    The chunks are parsed from `raw`, the bytes that were hashed, so the manifest's hash always describes
    the indexed text (a second read could see a newer version and pin stale chunks under the new hash).
    """
    s = c.settings
    if raw is None:
        raw = folder.read_regular_file(path, check_size(c, path))
    parsed = folder.parse_bytes(path, raw)
    doc_title = title or parsed.title or path.stem
    chunks = chunk_parsed(c, parsed, document, doc_title)
    if len(chunks) > s.max_chunks_per_file:
        raise DocumentError(f"{len(chunks)} chunks exceed the limit of {s.max_chunks_per_file} per file",
                            guidance="Raise RESEARCH_AGENT_MAX_CHUNKS_PER_FILE or split the file.")
    extra = {k: v for k, v in parsed.metadata.items() if k in ("description", "keywords", "tags")}
    return PreparedDocument(
        document=document, title=doc_title, kind="document", source=document,
        content_hash=content_hash(raw + (title or "").encode()), chunks=chunks, path=str(path), extra=extra,
        warnings=list(parsed.warnings) + duplicate_id_warnings(chunks),
    )


def duplicate_id_warnings(chunks: list[Any]) -> list[str]:
    """One warning per explicit node id that several sections of the document give: discovery reads them as
    one node with the first section's fields (a second `- id: spec` section's type was dropped silently)."""
    sections: dict[str, list[str]] = {}
    seen: set[int] = set()
    for chunk in chunks:
        if id(chunk.node) not in seen:  # the chunks of one section share their node object
            seen.add(id(chunk.node))
            sections.setdefault(chunk.node.id, []).append(chunk.header_path or "(before the first header)")
    return [f"node id {nid!r} is given to {len(paths)} sections ({'; '.join(repr(p) for p in paths[:5])}); "
            "they are read as one node with the first one's type and status: ids must be unique"
            for nid, paths in sections.items() if len(paths) > 1]


def chunk_metadata(collection: str, doc: PreparedDocument, chunk: Any, seq: int) -> dict[str, Any]:
    """A chunk's stored metadata. What a document or node repeats in each of its chunks is capped (the
    chunking module's *_MAX_* constants): uncapped, a 1.2 MB file with a long title made a 308 MB store."""
    from research_agent.ingest.chunking import (
        FIELD_MAX_CHARS,
        TITLE_MAX_CHARS,
        cap_header_path,
        cap_list,
        cap_text,
    )

    meta: dict[str, Any] = {
        "collection": collection,
        "source_document": doc.document,
        "document_title": cap_text(doc.title or "", TITLE_MAX_CHARS),
        "header_path": cap_header_path(chunk.header_path or ""),
        "content_type": chunk.content_type,
        "code_language": chunk.code_language,
        "chunk_sequence_id": seq,
        "content_hash": doc.content_hash,
        "kind": doc.kind,
        "source": doc.source,
        **to_metadata(chunk.node),
        "anchor": chunk.anchor,
        "page": chunk.page,
        "line_start": chunk.line_start,
        "line_end": chunk.line_end,
        "token_count": chunk.token_count,
    }
    for key in ("description", "added_at"):
        if isinstance(doc.extra.get(key), str):
            meta[key] = cap_text(doc.extra[key], FIELD_MAX_CHARS)
    kw = doc.extra.get("keywords") or doc.extra.get("tags")
    if isinstance(kw, list) and kw:
        meta["keywords"] = cap_list([str(k) for k in kw])
    return {k: v for k, v in meta.items() if v is not None}


def embedding_text(meta: dict[str, Any], text: str) -> str:
    """What is embedded: the chunk after a line with its title and header path, so short chunks keep context.

    The line is capped (chunking.embedding_context) also for chunks stored before the caps existed (`kb
    reindex` reads them back), and the chunker leaves room for it within the model's input length.
    """
    from research_agent.ingest.chunking import embedding_context

    context = embedding_context(meta.get("document_title"), meta.get("header_path"))
    return f"{context}\n{text}" if context and context not in text[:200] else text
