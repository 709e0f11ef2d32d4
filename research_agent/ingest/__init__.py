"""Ingestion: files and folders into a collection, incremental by content hash, atomic per document.

The public names are re-exported here, so `from research_agent import ingest` callers keep calling
`ingest.ingest_path(...)`. Where things live:

- parsing.py    file readers: Markdown, text, code, PDF, HTML, DOCX into one ParsedDocument, bounded
- nodes.py      the Markdown-JSON hybrid node format: metadata bullets under a header, the node fields
- chunking.py   header-aware chunks, each within the embedder's token limit and a byte bound
- folder.py     the folder walk and safe reads: what a run reads, skips, and what --prune may remove
- prepare.py    path policy, document keys and chunk ids, parse + chunk, the stored chunk metadata
- service.py    the crash-safe write (intents), recovery, ingest_path, prune, remove, reindex
- documents.py  reading what was ingested: list, manifest, text, chunks
- watch.py      keep a collection in sync with a folder (watchdog, debounced)

Only prepare, documents and service (and folder) load here: parsing and chunking load on first use, as
before the move. A test that replaces a write step (the crash hooks) must patch
`research_agent.ingest.service`, whose globals the write path reads; patching this package only changes
what outside callers see.
"""

from research_agent.ingest.documents import (
    ChunkView,
    DocumentChunks,
    DocumentContent,
    DocumentInfo,
    DocumentList,
    find_document,
    get_document,
    get_document_chunks,
    list_documents,
)
from research_agent.ingest.prepare import (
    PreparedDocument,
    check_allowed,
    check_size,
    chunk_ids,
    chunk_metadata,
    chunk_parsed,
    content_hash,
    document_key,
    duplicate_id_warnings,
    embedding_text,
    iter_folder,
    prepare_file,
    source_name,
    version_ids,
)
from research_agent.ingest.service import (
    EMBED_BATCH_CHUNKS,
    EMBED_SLICE_CHUNKS,
    STALE_INTENT_SECONDS,
    FileProblem,
    IngestProgress,
    IngestReport,
    ProgressFn,
    delete_chunks,
    delete_documents,
    embed_in_slices,
    ingest_path,
    prune_missing,
    recover_if_needed,
    recover_interrupted,
    reindex_collection,
    remove_document,
    write_documents,
)

__all__ = [
    "ChunkView", "DocumentChunks", "DocumentContent", "DocumentInfo", "DocumentList", "find_document",
    "get_document", "get_document_chunks", "list_documents",
    "PreparedDocument", "check_allowed", "check_size", "chunk_ids", "chunk_metadata", "chunk_parsed", "content_hash",
    "document_key", "duplicate_id_warnings", "embedding_text", "iter_folder", "prepare_file", "source_name",
    "version_ids",
    "EMBED_BATCH_CHUNKS", "EMBED_SLICE_CHUNKS", "STALE_INTENT_SECONDS", "FileProblem", "IngestProgress",
    "IngestReport", "ProgressFn",
    "delete_chunks",
    "delete_documents", "embed_in_slices", "ingest_path", "prune_missing", "recover_if_needed", "recover_interrupted",
    "reindex_collection", "remove_document", "write_documents",
]
