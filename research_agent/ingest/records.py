"""Records: JSON, JSONL/NDJSON and CSV files whose records are each a document (issue 17), such as a catalog
of MCP tool descriptions (find the right tool for a task among thousands) or an API reference.

A record becomes the document `<file>#<id>` (kind "record"): its text is the mapped text fields joined, then
one `field: value` line per metadata field; its title is the title field (else the id), its keywords land in
the chunk metadata the keyword index weighs and filters read. Re-running is incremental like add-folder: a
record whose mapped values hash the same is left alone, a changed one replaces its chunks, and with `prune`
records no longer in the file are removed. Everything is written through service.write_documents and removed
through service.delete_documents, the one write path.

Bounded memory: JSONL and CSV are streamed a line at a time, each line read with a cap (MAX_RECORD_BYTES; the
rest of a longer line is read in pieces and dropped, so a 1 GB line costs 1 MB), and documents are written in
batches of EMBED_BATCH_CHUNKS chunks. A JSON (non-lines) file is parsed whole, so it is refused above
MAX_JSON_FILE_BYTES. A record that cannot be used is skipped with its line (`tools.jsonl:17`), never the file.
Duplicate ids: the later record wins and the report warns (a catalog re-exported with an appended fix is the
common cause; refusing the whole file would block that).

Over 400 lines (~570): the three readers (~180 lines) and the run (~210) share RawRecord and the field
mapping; the readers would split cleanly into records_read.py if another format (XML, Parquet) is added.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator

from research_agent.catalog.collections import open_collection
from research_agent.errors import DocumentError
from research_agent.ingest import folder
from research_agent.ingest.prepare import PreparedDocument, check_allowed, chunk_parsed, content_hash, document_key
from research_agent.ingest.service import (
    EMBED_BATCH_CHUNKS,
    FileProblem,
    IngestProgress,
    IngestReport,
    ProgressFn,
    delete_documents,
    recover_if_needed,
    write_documents,
)

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

#: The reader each extension gets; `format` overrides it (a `.txt` export of JSON lines).
RECORD_FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
#: A JSON array file is parsed whole: Python objects cost ~10-40x the file (many small objects are the worst:
#: `[{},{},...]` peaked at 324 MB for 8 MB, 965 MB for 32 MB), so 8 MB keeps the parse near 300 MB and larger
#: catalogs go through JSONL, which streams (`jq -c '.[]' big.json > big.jsonl`). A candidate setting.
MAX_JSON_FILE_BYTES = 8 * 2**20
#: One JSONL line or CSV line; a record this size is a mistake (the longest ToolGym tool record is ~6 KB).
MAX_RECORD_BYTES = 2**20
#: Characters of text per record, cut beyond with a warning: ~70 chunks of MiniLM's 256 tokens.
MAX_RECORD_TEXT_CHARS = 100_000
#: A record id is part of the document key, which every chunk repeats.
MAX_ID_CHARS = 200
#: Problems, warnings and written documents listed in the report; the rest are counted (a 1M-line file with
#: one bad field everywhere must not make a 100 MB report).
MAX_LISTED = 1000
#: Records read between two progress reports while nothing is written (cancellation is checked there).
PROGRESS_EVERY = 1000


class RecordsReport(IngestReport):
    """An ingest report for one records file: documents are records; `files_seen` is 1."""

    format: str = ""
    records_seen: int = 0
    # Problems, warnings and documents beyond MAX_LISTED each, counted but not listed.
    not_listed: int = 0


@dataclass(frozen=True)
class RecordFields:
    """Which fields of a record make its document; names are keys or dotted paths (`server.name`)."""

    id: str
    text: tuple[str, ...]
    title: str | None = None
    keywords: str | None = None
    metadata: tuple[str, ...] = ()
    records_path: str | None = None  # JSON: the dotted path of the array inside a top-level object

    def __post_init__(self) -> None:
        if not self.id.strip() or not [t for t in self.text if t.strip()]:
            raise DocumentError("An id field and at least one text field are required",
                                guidance="Pass --id-field and --text-field (repeatable), e.g. --id-field name "
                                         "--text-field description.")


@dataclass
class RawRecord:
    """One record as read: its data (a dict) or why it could not be read; `where` names it (`line 17`)."""

    where: str
    data: dict[str, Any] | None = None
    problem: str | None = None


@dataclass
class Record:
    id: str
    title: str
    text: str
    keywords: list[str]
    warnings: list[str] = field(default_factory=list)

    def hash(self) -> str:
        return content_hash(json.dumps([self.id, self.title, self.text, self.keywords], ensure_ascii=False))


class RecordProblem(Exception):
    """A record that cannot be used; `record_id` when its id was read (its old version is then removed)."""

    def __init__(self, reason: str, record_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.record_id = reason, record_id


# -- fields -----------------------------------------------------------------------------------------------
def lookup(data: Any, name: str) -> Any:
    """The value of `name` in a record: the key itself (CSV headers may hold dots), else the dotted path
    through objects (and list indexes: `tags.0`); None when absent."""
    if isinstance(data, dict) and name in data:
        return data[name]
    value = data
    for part in name.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def value_text(value: Any) -> str:
    """A field's value as text: strings as they are, scalars printed, lists of scalars joined with ", ",
    anything else as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) for v in value):
        return ", ".join(value_text(v) for v in value if value_text(v))
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def as_keywords(value: Any) -> list[str]:
    """Keywords from a list, or from a comma-separated string."""
    items = value if isinstance(value, list) else str(value).split(",") if value is not None else []
    return [t for t in (value_text(v) for v in items) if t]


def build_record(data: dict[str, Any], fields: RecordFields) -> Record:
    """The record's id, title, text and keywords; RecordProblem when its id or text is missing."""
    rid = value_text(lookup(data, fields.id))
    if not rid or isinstance(lookup(data, fields.id), (dict, list)):
        raise RecordProblem(f"no id: the field {fields.id!r} is missing, empty or not a single value")
    if len(rid) > MAX_ID_CHARS or any(ch < " " for ch in rid):
        raise RecordProblem(f"the id in {fields.id!r} is over {MAX_ID_CHARS} characters or holds control characters")
    parts = [t for name in fields.text if (t := value_text(lookup(data, name)))]
    if not parts:
        raise RecordProblem(f"no text: {', '.join(repr(t) for t in fields.text)} missing or empty", record_id=rid)
    lines = [f"{name}: {v}" for name in fields.metadata if (v := value_text(lookup(data, name)))]
    text = "\n\n".join(parts + (["\n".join(lines)] if lines else []))
    warnings = []
    if len(text) > MAX_RECORD_TEXT_CHARS:
        text = text[:MAX_RECORD_TEXT_CHARS]
        warnings.append(f"text cut to {MAX_RECORD_TEXT_CHARS:,} characters")
    title = " ".join(value_text(lookup(data, fields.title)).split()) if fields.title else ""
    keywords = as_keywords(lookup(data, fields.keywords)) if fields.keywords else []
    return Record(id=rid, title=title or rid, text=text, keywords=keywords, warnings=warnings)


# -- reading -----------------------------------------------------------------------------------------------
def records_format(path: Path, format: str | None) -> str:
    fmt = format or RECORD_FORMATS.get(path.suffix.lower())
    if fmt not in set(RECORD_FORMATS.values()):
        raise DocumentError(f"Unsupported records format for {path.name}: {format or path.suffix or '(none)'}",
                            guidance="Use a .json, .jsonl, .ndjson, .csv or .tsv file, or pass --format.",
                            path=folder.display(str(path)))
    return fmt


def open_regular(path: Path) -> IO[bytes]:
    """The file opened for reading if it is a regular file (non-blocking open, type checked on the open
    descriptor, as folder.read_regular_file does: a FIFO must not hang the run)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise folder.not_regular(path, st.st_mode)
    return os.fdopen(fd, "rb")


def bounded_lines(fh: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """(line number, the line's bytes), or (number, None) for a line over MAX_RECORD_BYTES: the rest of it
    is read in MAX_RECORD_BYTES pieces and dropped, so memory stays bounded whatever the line's length."""
    number = 0
    while line := fh.readline(MAX_RECORD_BYTES + 1):
        number += 1
        if len(line) <= MAX_RECORD_BYTES or line.endswith(b"\n"):
            yield number, line
            continue
        while line and not line.endswith(b"\n"):
            line = fh.readline(MAX_RECORD_BYTES)
        yield number, None


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid UTF-8 (byte {exc.start})"
    return f"not valid JSON ({str(exc)[:200]})"


def _as_raw(where: str, data: Any) -> RawRecord:
    if not isinstance(data, dict):
        return RawRecord(where, problem=f"not a JSON object but {type(data).__name__}")
    return RawRecord(where, data=data)


def jsonl_records(fh: IO[bytes]) -> Iterator[RawRecord]:
    for number, line in bounded_lines(fh):
        where = f"line {number}"
        if line is None:
            yield RawRecord(where, problem=f"longer than {MAX_RECORD_BYTES // 2**20} MB")
            continue
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            yield RawRecord(where, problem=_json_problem(exc))
            continue
        yield _as_raw(where, data)


def json_records(fh: IO[bytes], path: Path, records_path: str | None) -> Iterator[RawRecord]:
    """The objects of a JSON array (the file's top level, or the array at `records_path`)."""
    raw = fh.read(MAX_JSON_FILE_BYTES + 1)
    if len(raw) > MAX_JSON_FILE_BYTES:
        raise DocumentError(f"{path.name} is over the {MAX_JSON_FILE_BYTES // 2**20} MB limit for a JSON file, "
                            "which is read whole", path=folder.display(str(path)),
                            guidance="Convert it to JSON lines (.jsonl, one record a line), which are read a "
                                     "record at a time in bounded memory: jq -c '.[]' in.json > out.jsonl "
                                     "(or jq -c '.path.to.array[]' for --records-path)")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DocumentError(f"{path.name} is {_json_problem(exc)}", path=folder.display(str(path)),
                            guidance="Fix the JSON, or use JSON lines so one bad record skips only itself.") from None
    items = lookup(data, records_path) if records_path else data
    if not isinstance(items, list):
        raise DocumentError(_no_array(path, data, records_path), path=folder.display(str(path)),
                            guidance="Name the array with --records-path (a dotted path such as data.items).")
    for number, item in enumerate(items, start=1):
        yield _as_raw(f"record {number}", item)


def _array_paths(data: Any, prefix: str = "", depth: int = 3) -> list[str]:
    """Dotted paths of the arrays in the top `depth` levels of objects, for the error's hint."""
    if not isinstance(data, dict) or depth == 0:
        return []
    found = []
    for key, value in list(data.items())[:100]:
        if isinstance(value, list):
            found.append(prefix + str(key))
        found += _array_paths(value, f"{prefix}{key}.", depth - 1)
    return found


def _no_array(path: Path, data: Any, records_path: str | None) -> str:
    arrays = _array_paths(data)[:10]
    where = f"at {records_path!r}" if records_path else "at the top level"
    hint = f"; arrays under: {', '.join(arrays)}" if arrays else ""
    return f"{path.name} holds no array of records {where}{hint}"


def csv_records(fh: IO[bytes], path: Path, fields: RecordFields, delimiter: str) -> Iterator[RawRecord]:
    """Rows as {header: value}. A line that is too long or not UTF-8 is fed to the csv reader as an empty
    line and the row that holds it is skipped; a csv.Error (a field over the csv module's 128 KB limit, a NUL)
    ends the file, since the reader cannot tell where the next row starts, and is reported at its line."""
    bad: dict[int, str] = {}

    def lines() -> Iterator[str]:
        for number, line in bounded_lines(fh):
            try:
                text = line.decode("utf-8-sig" if number == 1 else "utf-8") if line is not None else None
            except UnicodeDecodeError as exc:
                text, bad[number] = None, f"not valid UTF-8 (byte {exc.start})"
            if text is None:
                bad.setdefault(number, f"longer than {MAX_RECORD_BYTES // 2**20} MB")
            yield text if text is not None else "\n"

    # strict: an unclosed quote swallows every later row into one field up to the end of the file; read
    # leniently that was one record, and --prune removed the swallowed ones. Strictly it is a csv.Error, a
    # record that could not be read, which blocks prune. TSV has no quoting convention (`"5 inch" screen`).
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(lines(), delimiter=delimiter, strict=True, quoting=quoting)
    header: list[str] | None = None
    end = 0
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield RawRecord(f"line {start}", problem=_csv_problem(exc, start, reader.line_num))
            return
        end = reader.line_num
        problem = next((f"line {n} {bad[n]}" for n in range(start, end + 1) if n in bad), None)
        for n in [n for n in bad if n <= end]:
            del bad[n]
        if header is None and row:
            header = _csv_header(row, problem, path, fields)
        elif problem:
            yield RawRecord(f"line {start}", problem=problem)
        elif row and header is not None:
            yield RawRecord(f"line {start}", data=dict(zip(header, row)))


def _csv_problem(exc: csv.Error, start: int, end: int) -> str:
    """Why the row from line `start` could not be read; the reader stopped at line `end`."""
    hint = " (an unclosed quote?)" if "end of data" in str(exc) or "expected after" in str(exc) else ""
    return (f"not valid CSV in lines {start}-{end}: {str(exc)[:200]}{hint}; the rest of the file was not read, "
            "so its records are neither added nor pruned")


def _csv_header(row: list[str], problem: str | None, path: Path, fields: RecordFields) -> list[str]:
    """The header row, checked: a column named by --id-field or --text-field that is not there would skip
    every row, so it ends the run at once with the columns that are."""
    header = [h.strip() for h in row]
    if problem:
        raise DocumentError(f"The header of {path.name} cannot be read: {problem}", path=folder.display(str(path)),
                            guidance="The first line must name the columns.")
    missing = [n for n in (fields.id, *fields.text) if n not in header]
    if fields.id in missing or all(t in missing for t in fields.text):
        raise DocumentError(f"{path.name} has no column {', '.join(repr(m) for m in missing)}",
                            guidance="Columns: " + ", ".join(header[:30]), path=folder.display(str(path)))
    return header


def read_records(fh: IO[bytes], path: Path, fmt: str, fields: RecordFields) -> Iterator[RawRecord]:
    if fmt == "jsonl":
        return jsonl_records(fh)
    if fmt == "json":
        return json_records(fh, path, fields.records_path)
    return csv_records(fh, path, fields, "\t" if fmt == "tsv" else ",")


# -- keys -------------------------------------------------------------------------------------------------
def records_prefix(path: Path, manifests: dict[str, dict[str, Any]]) -> str:
    """The key prefix of a file's records: its name (`tools.jsonl`, keys `tools.jsonl#<id>`), kept once given;
    its absolute path when another file's documents already use that name."""
    for m in manifests.values():
        if m.get("kind") == "record" and m.get("path") == str(path):
            return (m.get("extra") or {}).get("records_file") or m["document"].rsplit("#", 1)[0]
    name = path.name
    taken = any(m.get("document", "") == name or m.get("document", "").startswith(name + "#")
                for m in manifests.values())
    return path.as_posix() if taken else name


# -- the run ----------------------------------------------------------------------------------------------
UNCHANGED, ADDED, UPDATED, SKIPPED = range(4)


class _Run:
    """One file's records read, compared by hash, batched and written; what the report needs at the end."""

    def __init__(self, c: Container, collection: str, path: Path, prefix: str, fields: RecordFields,
                 existing: dict[str, dict[str, Any]], report: RecordsReport, notify: ProgressFn) -> None:
        self.c, self.collection, self.path, self.prefix, self.fields = c, collection, path, prefix, fields
        self.report, self.notify = report, notify
        self.before = {k: m["content_hash"] for k, m in existing.items() if m.get("path") == str(path)}
        self.stored = dict(self.before)           # key -> hash of the version in the store now
        # document -> its last record's number * 4 + outcome: one small int per record, so a 1M-record file
        # costs the run ~140 MB rather than the ~320 MB that (hash, where, key) tuples took (measured).
        self.last: dict[str, int] = {}
        self.pending: dict[str, PreparedDocument] = {}
        self.stale: dict[str, dict[str, Any]] = {}  # records whose id is there but text is not: old versions go
        self.existing = existing
        self.unidentified = 0  # records whose id could not be read: --prune cannot tell them from gone ones
        self.chunks_total = 0

    def listed(self, items: list[Any], item: Any) -> None:
        if len(items) < MAX_LISTED:
            items.append(item)
        else:
            self.report.not_listed += 1

    def take(self, raw: RawRecord) -> None:
        self.report.records_seen += 1
        if self.report.records_seen % PROGRESS_EVERY == 0:
            self._progress("reading")
        try:
            if raw.problem:
                raise RecordProblem(raw.problem)
            record = build_record(raw.data or {}, self.fields)
        except RecordProblem as exc:
            self._skip(raw.where, exc.reason, exc.record_id)
            return
        except RecursionError:  # a value nested too deeply to print as JSON
            self._skip(raw.where, "nested too deeply to read", None)
            return
        self._keep(raw.where, record)

    def _skip(self, where: str, reason: str, record_id: str | None) -> None:
        place = f"{self.prefix}:{where.split()[-1]}" if where.startswith("line") else f"{self.prefix} {where}"
        if record_id is None:
            self.unidentified += 1
        else:  # its id is known: like a file that turned unusable, its old version goes (search must not find it)
            document = self._document(record_id)
            key = document_key(self.collection, document)
            self._repeated(document, key, where)
            self._outcome(document, where, SKIPPED)
            stored = self._stored_manifest(key)
            if stored is not None:
                self.stale[key] = stored
                reason += " (its previous version was removed from the index)"
        self.listed(self.report.skipped, FileProblem(path=place, reason=reason))

    def _document(self, record_id: str) -> str:
        return f"{self.prefix}#{record_id}"

    def _keep(self, where: str, record: Record) -> None:
        document = self._document(record.id)
        key = document_key(self.collection, document)
        digest = record.hash()
        self._repeated(document, key, where)
        before = self.before.get(key)
        self._outcome(document, where, UNCHANGED if before == digest else ADDED if before is None else UPDATED)
        self.stale.pop(key, None)
        for w in record.warnings:
            self.listed(self.report.warnings, FileProblem(path=document, reason=f"{where}: {w}"))
        if self.stored.get(key) == digest:
            return
        self.pending[key] = self._prepare(document, record, digest)
        self.chunks_total += len(self.pending[key].chunks)
        if sum(len(d.chunks) for d in self.pending.values()) >= EMBED_BATCH_CHUNKS:
            self.flush()

    def _repeated(self, document: str, key: str, where: str) -> None:
        """A second record with this id (kept or skipped, the later one wins): warn, drop the earlier unwritten."""
        if document in self.last:
            first = f"{where.split()[0]} {self.last[document] // 4}"
            self.listed(self.report.warnings, FileProblem(
                path=document, reason=f"id repeated at {where} (first at {first}): the later record wins"))
            self.pending.pop(key, None)

    def _stored_manifest(self, key: str) -> dict[str, Any] | None:
        """The manifest of the version of `key` in the store now: the one before the run, or the one an
        earlier batch of this run wrote (a repeated id), read back so its chunks are the ones deleted."""
        if key not in self.stored:
            return None
        if key in self.existing and self.stored[key] == self.before.get(key):
            return self.existing[key]
        return self.c.store.registry_get([key]).get(key)

    def _prepare(self, document: str, record: Record, digest: str) -> PreparedDocument:
        from research_agent.ingest.parsing import ParsedDocument

        chunks = chunk_parsed(self.c, ParsedDocument(text=record.text, format="text", title=record.title),
                              document, record.title)
        for chunk in chunks:  # lines within the record's text are not lines of the file: no citation is better
            chunk.line_start = chunk.line_end = None
        extra: dict[str, Any] = {"records_file": self.prefix, "record_id": record.id}
        if record.keywords:
            extra["keywords"] = record.keywords
        return PreparedDocument(document=document, title=record.title, kind="record", source=self.prefix,
                                content_hash=digest, chunks=chunks, path=str(self.path), extra=extra)

    def flush(self) -> None:
        if not self.pending:
            return
        docs = list(self.pending.values())
        self.pending.clear()
        done = self.report.chunks_written

        def embedded(chunks: int, total: int) -> None:
            self._progress("embedding", done + chunks)

        self.report.chunks_written += write_documents(self.c, self.collection, docs, embedded)
        for doc in docs:
            self.stored[document_key(self.collection, doc.document)] = doc.content_hash
        self._progress("writing")

    def _progress(self, stage: str, chunks: int | None = None) -> None:
        """Records as the unit (the total is unknown while the file streams); cancellation is checked here."""
        self.notify(IngestProgress(stage=stage, files_done=self.report.records_seen, files_total=0,
                                   chunks_done=self.report.chunks_written if chunks is None else chunks,
                                   chunks_total=self.chunks_total, current=self.prefix,
                                   files_progress=float(self.report.records_seen)))

    def _outcome(self, document: str, where: str, outcome: int) -> None:
        """Record what became of `document` (a repeated id replaces the earlier record's outcome, so it counts
        once): added / updated / unchanged against the store's version before the run, or skipped."""
        counts = (self.report.unchanged, self.report.added, self.report.updated, 0)
        previous = self.last.get(document)
        tally = list(counts)
        if previous is not None:
            tally[previous % 4] -= 1
        tally[outcome] += 1
        self.report.unchanged, self.report.added, self.report.updated = tally[:3]
        self.last[document] = int(where.split()[-1]) * 4 + outcome
        if outcome in (ADDED, UPDATED) and previous is None:
            self.listed(self.report.documents, document)


def ingest_records(c: Container, path: str | Path, collection: str, fields: RecordFields, *,
                   format: str | None = None, prune: bool = False, progress: ProgressFn | None = None,
                   allowed_roots: list[Path] | None = None) -> RecordsReport:
    """Ingest a JSON, JSONL/NDJSON or CSV file, one document per record (see the module docstring).

    `prune` removes this file's records whose ids are no longer in it, unless some records could not be read
    (their ids are unknown, so a record with a broken line would look gone): then nothing is pruned and the
    report's `not_pruned` says why.
    """
    started = time.perf_counter()
    target = check_allowed(Path(path), allowed_roots)
    if not target.is_file():
        raise DocumentError(f"No such file: {folder.display(str(path))}", guidance="Pass a records file.",
                            path=folder.display(str(path)[:200]))
    fmt = records_format(target, format)
    c.store.refresh()
    open_collection(c, collection)  # fail before reading on an unknown collection or a model mismatch
    recover_if_needed(c, collection)
    existing = c.store.registry_find("document", collection)
    prefix = records_prefix(target, existing)
    report = RecordsReport(collection=collection, format=fmt, files_seen=1)
    run = _Run(c, collection, target, prefix, fields, existing, report, progress or (lambda p: None))
    with open_regular(target) as fh:
        for raw in read_records(fh, target, fmt, fields):
            run.take(raw)
    run.flush()
    gone = _prune(run, existing) if prune else {}
    removed = {**run.stale, **gone}
    delete_documents(c, collection, removed)
    report.removed = len(removed)
    report.removed_documents = sorted(m["document"] for m in removed.values())[:MAX_LISTED]
    report.seconds = round(time.perf_counter() - started, 3)
    run._progress("done")
    return report


def _prune(run: _Run, existing: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """This file's records not seen in this run; none when some records could not be identified."""
    gone = {k: m for k, m in existing.items()
            if m.get("kind") == "record" and m.get("path") == str(run.path) and m["document"] not in run.last}
    if gone and run.unidentified:
        run.report.not_pruned = [FileProblem(path=run.prefix, reason=(
            f"{len(gone)} records are no longer in the file, but {run.unidentified} records could not be read "
            "(see skipped): they may be among them, so nothing was pruned; fix them and run again"))]
        return {}
    return gone
