"""Header-aware chunker: sections, sizes and splits. The hybrid node format it reads is in nodes.py.

Over 400 lines (~700): `_Chunker` is one ~370-line class whose size, split and emit steps share its token
budgets, counters and anchors; cutting it apart means threading that state through, left for later.

Line ranges: `assign_lines` finds each chunk's words on the file's lines after chunking (line_start/line_end,
1-based, front matter counted), for markdown, text and code; a chunk whose text the front matter holds (the
title/description of a file without body text) cites the front matter's lines, 1 to the closing `---`.

Token estimate: one token per word or digit run, per punctuation mark and per underscore, plus one more
per 8 characters of a long run. That tracks WordPiece/BPE counts (common words whole, long identifiers
split) within ~20 % on English prose and code, with no tokenizer import.

Node ids: the `id` metadata field when given; otherwise "n-" + sha1(source + "\\n" + header_path)[:12],
with "\\n" + occurrence number appended to the hashed string for the 2nd, 3rd ... header with the same
path, so ids are stable across re-ingests and unique within a document. A document that declares itself a node
(front-matter `id`/`type`/`status`, or bullets before the first header) has a root node parenting its top-level
headers; its one `#` heading, when nothing precedes it, is the root's own section (`_title_section`), and a
root without text of its own gets a stub chunk so that it exists (`root_stub`).

Hard bounds: every chunk holds at most `max_bytes` (MAX_CHUNK_BYTES) of UTF-8 and at most its token budget,
counted by `count_tokens` (the embedder's own tokenizer when the caller passes it, else the estimate above).
With `model_max_tokens` (what the embedding model reads, special tokens excluded) the budget is
min(max_tokens, model_max_tokens - tokens of the title/header-path line put before the chunk when it is
embedded), so no word of a chunk is cut off by the model: sized by the estimate alone, 58 % of SciFact's
chunks were longer than all-MiniLM-L6-v2's 256 word pieces. Oversized pieces split at the coarsest boundary
that works: paragraphs, sentences, lines, words, then characters; tables split by rows with the header row
repeated, fenced code by lines with the fence repeated. The metadata every chunk repeats (title, header
path, node fields) is capped by `cap_text`, `cap_header_path` and `cap_list`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from research_agent.ingest.nodes import (
    CONTENT_SEPARATOR,
    FRONT_MATTER_KEYS,
    NodeFields,
    node_fields,
    scalar,
    take_metadata,
)
from research_agent.ingest.parsing import ParsedDocument, strip_closing_hashes

#: The most UTF-8 bytes of text one chunk holds, whatever its token budget: ~4x what the default budget
#: packs of English prose (~1.5 KB), small enough that no line of minified code, base64 or table can make a
#: multi-MB chunk (a 1.2 MB table was one chunk, copied whole into Chroma and the keyword index).
MAX_CHUNK_BYTES = 8192
#: Caps on what every chunk of a document (or node) repeats in its metadata: with no cap a 1.2 MB Markdown
#: file with a long title and deep headers made a 308 MB store (the title and header path in each chunk,
#: twice more in the keyword index). Names this long are mistakes; the caps keep what identifies them.
TITLE_MAX_CHARS = 200
HEADER_PATH_MAX_CHARS = 300
FIELD_MAX_CHARS = 500          # description, node title and description
MAX_LIST_ITEMS = 32            # keywords, labels, blocked_by
LIST_ITEM_MAX_CHARS = 100      # one keyword, label or node id
ANCHOR_MAX_CHARS = 120
#: The line embedded before a chunk's text is shorter still: it spends the model's tokens on every chunk.
CONTEXT_TITLE_CHARS = 80
CONTEXT_PATH_CHARS = 120
_TOO_BIG = 1 << 30             # the token count of a text over the byte bound (never tokenized)
_COUNT_BATCH = 256

TokenCounter = Callable[[list[str]], list[int]]

_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_")
#: Matched on the line without trailing blanks; the closing `#` run goes by parsing.strip_closing_hashes (one
#: pattern doing both backtracked quadratically: tests/test_ingest_text_linear.py).
_HEADER = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*))?$")
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_FENCE_CLOSE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*$")
_TABLE_SEPARATOR = re.compile(r"^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CODE_SYMBOL = re.compile(
    r"^(?:export\s+|pub(?:\([^)]*\))?\s+|public\s+|private\s+|protected\s+|static\s+|async\s+|default\s+)*"
    r"(?:def|class|function\*?|func|fn|struct|interface|enum|trait|impl|type|module|object)\s+"
    r"(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)"
)

@dataclass
class Chunk:
    """One retrievable piece of a document with its place in the header tree and its node fields."""

    text: str
    header_path: str
    content_type: str
    code_language: str | None
    #: The node the chunk belongs to (nodes.py defines its fields); shared by the chunks of one section.
    node: NodeFields
    anchor: str
    page: int | None
    token_count: int

    #: The lines of the file (1-based, inclusive, front matter counted) the chunk's text comes from, for
    #: markdown, text and code files; None for PDF, HTML and DOCX, whose text is not the file's.
    line_start: int | None = None
    line_end: int | None = None

    @property
    def node_id(self) -> str:
        return self.node.id


@dataclass
class _Section:
    level: int  # 0 for text before the first header
    title: str
    header_line: str
    items: list[tuple[str, Any]] = field(default_factory=list)  # ("line", str) | ("fence", (lang, text, inner))


def estimate_tokens(text: str) -> int:
    """Approximate subword-token count of `text` (see the module docstring for the rule)."""
    return sum(1 + (len(piece) - 1) // 8 for piece in _TOKEN.findall(text))


def estimate_counts(texts: list[str]) -> list[int]:
    """`estimate_tokens` of each text: the token counter of backends without a tokenizer."""
    return [estimate_tokens(t) for t in texts]


def cap_text(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def cap_header_path(path: str, limit: int = HEADER_PATH_MAX_CHARS) -> str:
    """A header path of at most `limit` characters that keeps its most specific (last) headers."""
    parts = path.split(" > ")
    if len(path) <= limit or len(parts) == 1:
        return cap_text(path, limit)
    kept = [cap_text(parts[-1], limit - 4)]  # 4: the leading "… > "
    for part in reversed(parts[:-1]):
        if len(part) + 3 + sum(len(k) + 3 for k in kept) + 1 > limit:
            break
        kept.insert(0, part)
    return "… > " + " > ".join(kept)


def cap_list(items: list[str], max_items: int = MAX_LIST_ITEMS) -> list[str]:
    """At most `max_items` items of at most LIST_ITEM_MAX_CHARS characters each."""
    return [cap_text(str(item), LIST_ITEM_MAX_CHARS) for item in items[:max_items]]


def embedding_context(title: str | None, header_path: str | None) -> str:
    """The line embedded before a chunk: its title and header path, capped (CONTEXT_*_CHARS)."""
    parts = (cap_text(title or "", CONTEXT_TITLE_CHARS), cap_header_path(header_path or "", CONTEXT_PATH_CHARS))
    return " > ".join(p for p in parts if p)


def slugify(header: str) -> str:
    """GitHub-style anchor for a header: lowercase, punctuation dropped, spaces to hyphens."""
    # Links and images render as their text; no bracket inside a link's text or target, so a run of `[`
    # cannot make the scan quadratic (tests/test_ingest_text_linear.py).
    text = re.sub(r"!?\[([^\[\]]*)\]\([^)\[]*\)", r"\1", header)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def chunk_document(
    doc: ParsedDocument, *, source: str, max_tokens: int = 350, overlap_tokens: int = 0,
    count_tokens: TokenCounter | None = None, model_max_tokens: int | None = None, title: str | None = None,
    max_bytes: int = MAX_CHUNK_BYTES,
) -> list[Chunk]:
    """Split a parsed document into chunks within the token budget and `max_bytes` (module docstring).

    count_tokens: the embedder's token counter (a list of texts -> their counts); model_max_tokens: what the
    model reads; title: the document title embedded with each chunk (default: the parsed title).
    """
    chunker = _Chunker(source, max(1, max_tokens), max(0, min(overlap_tokens, max_tokens // 2)),
                       count=count_tokens or estimate_counts, model_max=model_max_tokens,
                       title=doc.title if title is None else title, max_bytes=max(64, max_bytes))
    if doc.format == "pdf" and doc.pages:
        for number, text in doc.pages:
            chunker.prose(text, header_path=f"Page {number}", node=chunker.node(f"Page {number}"), page=number)
    elif doc.format == "text":
        chunker.prose(doc.text, header_path="", node=chunker.node(""))
    elif doc.format == "code":
        chunker.code(doc.text, doc.code_language)
    else:
        chunker.markdown(doc.text, doc.metadata)
    if doc.format in LINE_FORMATS:
        # Code chunks cut at the syntax tree know their lines already (code_chunks.py).
        assign_lines([c for c in chunker.chunks if c.line_start is None], doc.text, doc.first_line,
                     back=chunker.overlap_tokens, count=chunker.count, max_bytes=chunker.max_bytes)
        for chunk in chunker.from_front_matter:  # its text is not in doc.text, which starts after the front matter
            chunk.line_start, chunk.line_end = 1, max(chunk.line_end or 0, doc.first_line - 1)
    return chunker.chunks


#: Formats whose parsed text is the file's own text, so a chunk's words can be found on the file's lines.
LINE_FORMATS = frozenset({"markdown", "text", "code"})


def assign_lines(chunks: list[Chunk], text: str, first_line: int, *, back: int = 0,
                 count: TokenCounter | None = None, max_bytes: int = MAX_CHUNK_BYTES) -> None:
    """Set each chunk's line_start/line_end from where its words are in `text`, whose first line is the file's
    `first_line`. Chunks come in document order, so each is looked for from where the previous one ended
    (less `back` words: the overlap it repeats). Most chunks are a run of the file's words; the others drop
    markup (metadata bullets) or repeat it (a split table's header row, a split fence's markers) and are
    aligned with difflib instead (on 127 files of this repository: 0.7 s for 1,154 chunks).

    A chunk that is a run of the file's words also gets the file's line breaks back (`_file_layout`), when
    that costs no token (by `count`, the chunker's counter) and no byte over `max_bytes`: a hard-wrapped
    paragraph split at sentences was one line per piece, so `kb get` could place only its first line
    (issue 17: lines 48-59 of a hit citing 47-59 were "not stored")."""
    import bisect

    # One scan of the whole text (a word never spans a line break); a word's line is the breaks before it.
    found = list(_WORD.finditer(text))
    words = [m.group() for m in found]
    offsets = [m.start() for m in found]
    breaks = [m.start() for m in _BREAK.finditer(text)]
    numbers = [first_line + bisect.bisect_left(breaks, at) for at in offsets]
    where: dict[str, list[int]] = {}
    for i, word in enumerate(words):
        where.setdefault(word, []).append(i)
    cursor = missed = 0  # missed: words of the chunks not found since the last one found (they lie ahead)
    relaid: list[tuple[Chunk, str]] = []
    for chunk in chunks:
        chunk_words = chunk.text.split()
        start = max(0, cursor - back - 4)
        # Between two chunks lies markup, not prose: the window is a few times the chunk's length.
        end = min(len(words), start + 2 * (len(chunk_words) + missed) + 256)
        if len(chunk_words) == 1:  # a piece of a longer word (a 50 KB "word" cut into runs): the next word
            end = min(end, cursor + 2)
        exact = _exact_span(chunk_words, words, where, start, end)
        span = exact or _aligned_span(chunk_words, words, start, end)
        if span is None:
            missed += len(chunk_words)
            continue
        if exact and (laid := _file_layout(chunk.text, text, offsets[span[0]:span[1] + 1])) is not None:
            relaid.append((chunk, laid))
        chunk.line_start, chunk.line_end = numbers[span[0]], numbers[span[1]]
        cursor, missed = max(cursor, span[1] + 1), 0
    counts = count([laid for _, laid in relaid]) if count and relaid else [0] * len(relaid)
    for (chunk, laid), tokens in zip(relaid, counts):
        if tokens <= chunk.token_count and len(laid.encode("utf-8")) <= max(max_bytes, len(chunk.text.encode())):
            chunk.text = laid


_WORD = re.compile(r"\S+")
_BREAK = re.compile(r"\n")
#: A header line: the blank the chunker writes after one is its own layout, kept (documents.py AFTER_HEADER).
_HEADER_LINE = re.compile(r"(?:^|\n) {0,3}#{1,6}[ \t][^\n]*$")


def _file_layout(chunk_text: str, text: str, starts: list[int]) -> str | None:
    """The chunk's text with the file's line breaks where the chunker moved them, or None when nothing moved.

    `starts` are the file offsets of the chunk's words (the chunk is that run of the file's words). Between two
    words, the file's blanks replace the chunk's when one has a line break and the other none (a piece of a
    hard-wrapped paragraph packed with spaces, or a sentence split mid-line packed with a blank line), or when
    the chunk has more line breaks than the file not after a header (pieces packed with a blank line where the
    file has one break). Blank runs the chunker shortened and the blank after a header stay as they are."""
    found = list(re.finditer(r"\S+", chunk_text))
    if not found or len(found) != len(starts):
        return None
    indent = text[text.rfind("\n", 0, starts[0]) + 1:starts[0]]  # a chunk opening an indented line keeps it
    moved = found[0].start() == 0 and bool(indent) and not indent.strip()
    last = found[-1]
    if chunk_text[found[0].start():last.end()] == text[starts[0]:starts[-1] + last.end() - last.start()]:
        # The chunk is the file's run verbatim (most chunks): every blank between its words is the file's, so
        # only the indent can move. `_relaid` would return the same, word by word (~0.3 ms a chunk).
        return indent + chunk_text if moved else None
    return _relaid(chunk_text, text, starts, found, indent, moved)


def _relaid(chunk_text: str, text: str, starts: list[int], found: list[re.Match[str]], indent: str,
            moved: bool) -> str | None:
    """`_file_layout`'s walk over the blanks between the chunk's words (`found`, at file offsets `starts`)."""
    out: list[str] = [indent if moved else chunk_text[: found[0].start()]]
    for k, word in enumerate(found):
        out.append(word.group())
        if k + 1 == len(found):
            break
        ours = chunk_text[word.end():found[k + 1].start()]
        theirs = text[starts[k] + len(word.group()):starts[k + 1]]
        ours_nl, theirs_nl = ours.count("\n"), theirs.count("\n")
        if ((ours_nl == 0) != (theirs_nl == 0)
                or (ours_nl > theirs_nl >= 1 and not _HEADER_LINE.search(chunk_text, 0, word.end()))):
            ours, moved = theirs, True
        out.append(ours)
    out.append(chunk_text[found[-1].end():])
    return "".join(out) if moved else None


def _exact_span(chunk_words: list[str], words: list[str], where: dict[str, list[int]], start: int,
                end: int) -> tuple[int, int] | None:
    """The first run of the file's words equal to the chunk's within words[start:end]."""
    import bisect

    if not chunk_words:
        return None
    n, positions = len(chunk_words), where.get(chunk_words[0], [])
    for i in positions[bisect.bisect_left(positions, start):bisect.bisect_left(positions, end)]:
        if words[i:i + n] == chunk_words:
            return i, i + n - 1
    return None


def _aligned_span(chunk_words: list[str], words: list[str], start: int, end: int) -> tuple[int, int] | None:
    """First and last index of the chunk's words aligned by difflib within words[start:end]: runs of two words
    or more, covering at least half of the chunk (a lone match is too often a repeated fence marker); a chunk
    of one word is found in the word that holds it."""
    import difflib

    if len(chunk_words) == 1:
        return next(((i, i) for i in range(start, end) if chunk_words[0] in words[i]), None)
    matcher = difflib.SequenceMatcher(None, chunk_words, words[start:end], autojunk=False)
    strong = [b for b in matcher.get_matching_blocks() if b.size >= 2]
    if 2 * sum(b.size for b in strong) < len(chunk_words):
        return None
    return start + strong[0].b, start + strong[-1].b + strong[-1].size - 1


# Split levels for an oversized text, coarsest first: sentences, lines, words (then characters).
_SPLITS = ((_SENTENCE_END, " "), (re.compile(r"\n"), "\n"), (re.compile(r"\s+"), " "))
_PROSE, _LINES, _WORDS = 0, 1, 2


class _Chunker:
    def __init__(self, source: str, max_tokens: int, overlap_tokens: int, *, count: TokenCounter,
                 model_max: int | None, title: str | None, max_bytes: int) -> None:
        self.source = source
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self.count = count
        self.model_max = model_max
        self.title = title
        self.max_bytes = max_bytes
        self.chunks: list[Chunk] = []
        self._path_counts: dict[str, int] = {}
        self._anchor_counts: dict[str, int] = {}
        self._budgets: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self._fragments: set[str] = set()
        #: Chunks opening with the front matter's title/description (outline, root stub): they cite its lines.
        self.from_front_matter: list[Chunk] = []

    def node(self, header_path: str, meta: dict[str, Any] | None = None, parent_id: str | None = None) -> NodeFields:
        occurrence = self._path_counts.get(header_path, 0) + 1
        self._path_counts[header_path] = occurrence
        key = self.source + "\n" + header_path + (f"\n{occurrence}" if occurrence > 1 else "")
        return node_fields(meta, "n-" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:12], parent_id)

    def anchor(self, title: str) -> str:
        slug = slugify(title)[:ANCHOR_MAX_CHARS]
        seen = self._anchor_counts.get(slug, 0)
        self._anchor_counts[slug] = seen + 1
        return f"{slug}-{seen}" if seen else slug  # GitHub numbers repeated anchors the same way

    # -- sizes ----------------------------------------------------------------------------------------

    def budget(self, header_path: str) -> int:
        """Tokens a chunk under `header_path` may hold: max_tokens, less what the embedded context line takes
        of the model's input when the model's limit is known."""
        if self.model_max is None:
            return self.max_tokens
        if header_path not in self._budgets:
            context = embedding_context(self.title, header_path)
            reserve = self.sizes([context])[0] + 1 if context else 0  # +1: the line break may merge differently
            self._budgets[header_path] = max(1, min(self.max_tokens, self.model_max - reserve))
        return self._budgets[header_path]

    def sizes(self, texts: list[str]) -> list[int]:
        """Token counts in batches; a text over the byte bound is too big without being tokenized."""
        out = [0] * len(texts)
        todo: list[int] = []
        for i, text in enumerate(texts):
            if len(text) > self.max_bytes and len(text.encode("utf-8")) > self.max_bytes:
                out[i] = _TOO_BIG
            elif text in self._counted:
                out[i] = self._counted[text]
            else:
                todo.append(i)
        if len(self._counted) > 4 * _COUNT_BATCH:
            self._counted.clear()  # the cache serves the re-checks of one section; keep it small
        for start in range(0, len(todo), _COUNT_BATCH):
            batch = todo[start:start + _COUNT_BATCH]
            for i, n in zip(batch, self.count([texts[i] for i in batch])):
                out[i] = self._counted[texts[i]] = n
        return out

    def fits(self, text: str, budget: int) -> bool:
        return self.sizes([text])[0] <= budget

    def fit(self, text: str, budget: int, level: int = _PROSE) -> list[str]:
        """`text` as pieces within `budget` and the byte bound: split at sentences, lines, words, characters."""
        if self.fits(text, budget):
            return [text]
        for splitter, joiner in _SPLITS[level:]:
            level += 1
            parts = [p for p in splitter.split(text) if p.strip()]
            if len(parts) > 1:
                return self.pack(parts, budget, joiner, level=level)
        return self._split_chars(text.strip(), budget)

    def _split_chars(self, word: str, budget: int) -> list[str]:
        """A text with no space to split at (a base64 blob, a 50 KB "word"), cut into runs of characters."""
        step = max(1, min(len(word), self.max_bytes, budget * 4))
        out: list[str] = []
        pos = 0
        while pos < len(word):
            piece = word[pos:pos + step]
            while step > 1 and not self.fits(piece, budget):
                step = max(1, step // 2)
                piece = word[pos:pos + step]
            out.append(piece)
            pos += len(piece)
        self._fragments.update(out)  # `pack` must not join them again with a space between
        return out

    def _leaves(self, units: list[str], room: int, level: int) -> list[tuple[str, int]]:
        """The units with their sizes, each one too big for `room` split finer (see `fit`)."""
        out: list[tuple[str, int]] = []
        for unit, size in zip(units, self.sizes(units)):
            if size <= room:
                out.append((unit, size))
            else:
                pieces = self.fit(unit, room, level)
                out.extend(zip(pieces, self.sizes(pieces)))
        return out

    def pack(self, units: list[str], budget: int, joiner: str, *, level: int = _PROSE, first: str = "",
             overlap: int = 0) -> list[str]:
        """Join consecutive units into pieces within `budget`; `first` (a header line) opens the first piece,
        and the last `overlap` tokens of a piece open the next. Sums of unit sizes are checked against the
        whole piece's count, since a tokenizer may count a join differently from its parts."""
        pieces: list[str] = []
        first_size = self.sizes([first])[0] if first else 0
        if first and first_size > budget // 2:
            pieces += self.fit(first, budget, level)  # a giant header line: its own pieces
            first, first_size = "", 0
        overlap = min(overlap, budget // 2)
        room = max(1, budget - max(first_size, overlap) - 1) if (first or overlap) else budget
        groups: list[tuple[str, list[str]]] = []
        prefix, group, tokens, size = first, [], first_size, _nbytes(first)
        joiner_size = _nbytes(joiner)
        after_fragment = False
        for text, count in self._leaves(units, room, level):
            nbytes = _nbytes(text) + joiner_size
            fragment = text in self._fragments
            if ((group or prefix) and (tokens + count > budget or size + nbytes > self.max_bytes)
                    or group and (fragment or after_fragment)):
                if group or not groups:  # a prefix alone is kept only when it is the lead of the first piece
                    groups.append((prefix, group))
                prefix = self._tail(joiner.join([prefix, *group] if prefix else group), overlap) if group else ""
                if prefix and _nbytes(prefix) + nbytes > self.max_bytes:
                    prefix = ""
                group, tokens, size = [], (self.sizes([prefix])[0] if prefix else 0), _nbytes(prefix)
            group.append(text)
            tokens += count
            size += nbytes
            after_fragment = fragment
        if group or (prefix and not groups):
            groups.append((prefix, group))
        for prefix, group in groups:
            pieces += self._verified(prefix, group, joiner, budget)
        return pieces

    def _verified(self, prefix: str, group: list[str], joiner: str, budget: int) -> list[str]:
        """The piece `prefix + group` if its real count fits, else the group halved until it does."""
        text = joiner.join([prefix, *group] if prefix else group)
        if self.fits(text, budget) or not group:
            return [text]
        if len(group) == 1:
            return ([prefix] if prefix else []) + group
        mid = len(group) // 2
        return self._verified(prefix, group[:mid], joiner, budget) + self._verified("", group[mid:], joiner, budget)

    def _tail(self, text: str, tokens: int) -> str:
        """The last words of `text` worth at most `tokens` tokens, repeated at the start of the next chunk."""
        if tokens <= 0:
            return ""
        words = text.split()[-(2 * tokens + 2):]  # a word is at least ~1 token: no need to count more
        taken, used = 0, 0
        for size in reversed(self.sizes(words)):
            if used + size > tokens:
                break
            taken, used = taken + 1, used + size
        return " ".join(words[len(words) - taken:]) if taken else ""

    def emit(self, text: str, *, header_path: str, content_type: str, language: str | None, node: NodeFields,
             anchor: str = "", page: int | None = None) -> None:
        text = text.strip("\n")
        if not text.strip():
            return
        for piece in self.fit(text, self.budget(header_path)):  # every chunk is checked here, once more
            piece = piece.strip("\n")
            if piece.strip():
                self.chunks.append(Chunk(
                    text=piece, header_path=header_path, content_type=content_type, code_language=language,
                    node=node, anchor=anchor, page=page, token_count=estimate_tokens(piece),
                ))

    # -- plain text and PDF pages ------------------------------------------------------------------

    def prose(self, text: str, *, header_path: str, node: NodeFields, page: int | None = None,
              anchor: str = "", lead: str = "") -> None:
        """Pack blank-line separated paragraphs; `lead` (the section header) opens the first chunk."""
        paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
        for piece in self.pack(paragraphs, self.budget(header_path), "\n\n", first=lead,
                               overlap=self.overlap_tokens):
            self.emit(piece, header_path=header_path, content_type="prose", language=None, node=node,
                      anchor=anchor, page=page)

    # -- tables and fenced code over the budget ----------------------------------------------------

    def table_pieces(self, table: str, budget: int, lead: str) -> list[str]:
        """A table split by rows, each piece opening with the header row and its separator."""
        lines = table.split("\n")
        header = "\n".join(lines[:2])
        return self._wrapped(lines[2:], budget, lead, header, "") or self.pack(lines, budget, "\n", level=_WORDS,
                                                                              first=lead)

    def fence_pieces(self, fenced: str, budget: int, lead: str) -> list[str]:
        """Fenced code split by lines, each piece fenced again with the opening and closing markers."""
        lines = fenced.split("\n")
        return self._wrapped(lines[1:-1], budget, lead, lines[0], lines[-1]) or self.pack(
            lines, budget, "\n", level=_WORDS, first=lead)

    def _wrapped(self, lines: list[str], budget: int, lead: str, head: str, foot: str) -> list[str]:
        """Lines packed between `head` and `foot` (the lead before the first); [] when they leave no room."""
        overhead = sum(self.sizes([t for t in (lead, head, foot) if t])) + 3
        if overhead > budget // 2 or not lines:
            return []
        pieces = [f"{head}\n{p}" + (f"\n{foot}" if foot else "")
                  for p in self.pack(lines, budget - overhead, "\n", level=_WORDS)]
        if lead and pieces:
            pieces[0] = f"{lead}\n\n{pieces[0]}"
        return pieces

    # -- source code -------------------------------------------------------------------------------

    def code(self, text: str, language: str | None) -> None:
        node = self.node("")
        if self.code_by_tree(text, language, node):
            return
        units: list[list[str]] = [[]]
        lines = text.split("\n")
        for i, line in enumerate(lines):
            # A blank line followed by a column-0 line (not a closing bracket) ends a top-level block.
            if not line.strip() and i + 1 < len(lines) and lines[i + 1][:1] not in ("", " ", "\t", "}", ")", "]"):
                units.append([])
                continue
            units[-1].append(line)
        blocks = ["\n".join(u).strip("\n") for u in units if "".join(u).strip()]
        # A few tokens are kept for the symbol that names the chunk in its embedded context line.
        budget = max(1, self.budget("") - (8 if self.model_max else 0))
        for piece in self.pack(blocks, budget, "\n\n", level=_LINES):
            self._emit_code(piece, language, node)

    def code_by_tree(self, text: str, language: str | None, node: NodeFields) -> bool:
        """Chunks cut at functions and classes, named by symbol path, lines set (code_chunks.py); False when
        the file is left to the blank-line split (no grammar or tree-sitter, a broken or huge file)."""
        from research_agent.ingest.code_chunks import code_chunks, module_name

        pieces = code_chunks(text, language, lambda path: self.budget(cap_header_path(path)), self.sizes,
                             module=module_name(self.source), max_bytes=self.max_bytes)
        for piece in pieces or []:
            before = len(self.chunks)
            self.emit(piece.text, header_path=cap_header_path(piece.symbol_path), content_type="code_block",
                      language=language, node=node)
            for chunk in self.chunks[before:]:
                chunk.line_start, chunk.line_end = piece.line_start, piece.line_end
        return pieces is not None

    def _emit_code(self, text: str, language: str | None, node: NodeFields) -> None:
        # The chunk is named after the definition it opens with, skipping decorators and comments.
        first = next((line for line in text.split("\n")
                      if line.strip() and not line.lstrip().startswith(("@", "#", "//", "/*", "*"))), "")
        symbol = _CODE_SYMBOL.match(first)
        self.emit(text, header_path=symbol.group(1)[:LIST_ITEM_MAX_CHARS] if symbol else "",
                  content_type="code_block", language=language, node=node)

    # -- markdown (also HTML and DOCX, which the parser converts to markdown) ----------------------

    def markdown(self, text: str, front_matter: dict[str, Any]) -> None:
        """Sections to chunks. A document that declares itself a node (front-matter `id`/`type`/`status`, or
        hybrid bullets before the first header) has a root node, the parent of its top-level headers; when no
        text precedes its one `#` heading, that heading's section is the root's own (`_title_section`)."""
        sections = _sections(text)
        preamble_meta, preamble = take_metadata(sections[0].items)
        doc_meta = _document_meta(front_matter, preamble_meta)
        title_at = _title_section(sections, doc_meta, preamble)
        stack: list[tuple[int, str, NodeFields]] = []  # (level, title, node) of enclosing headers
        root: NodeFields | None = None
        stub: tuple[int, str, str, str] = (0, "", "", "")  # where the root's stub goes: chunk index, text, path, anchor
        for i, section in enumerate(sections):
            meta, items = (preamble_meta, preamble) if i == 0 else take_metadata(section.items)
            if i == 0:
                if title_at is not None:
                    continue  # nothing but whitespace: the title section is the root
                node = root = self.node("", doc_meta)
                header_path, anchor, stub = "", "", (0, self.head_text(front_matter), "", "")
            else:
                if i == title_at:
                    meta = {**(doc_meta or {}), **(meta or {})}
                # Only a document that declares itself a node becomes the parent of its top-level headers.
                header_path, anchor, node = self.header_node(section, meta, stack,
                                                             root if doc_meta is not None else None)
                if i == title_at:
                    root, stub = node, (len(self.chunks), section.header_line, header_path, anchor)
            before = len(self.chunks)
            self._section_body(items, section.header_line, header_path, node, anchor)
            if len(self.chunks) == before and meta is not None and section.header_line and i != title_at:
                # A node with metadata but no content must still exist in the store for dependency queries.
                self.emit(section.header_line, header_path=header_path, content_type="prose", language=None,
                          node=node, anchor=anchor)
        if not self.chunks and root is not None:
            self.outline(front_matter, [s.header_line for s in sections if s.title], root)
        elif doc_meta is not None and root is not None and not any(c.node is root for c in self.chunks):
            self.root_stub(root, *stub)

    def header_node(self, section: _Section, meta: dict[str, Any] | None, stack: list[tuple[int, str, NodeFields]],
                    root: NodeFields | None) -> tuple[str, str, NodeFields]:
        """(header path, anchor, node) of a header section; `stack` (the enclosing headers) is updated."""
        while stack and stack[-1][0] >= section.level:
            stack.pop()
        header_path = " > ".join(t for t in [s[1] for s in stack] + [section.title] if t)
        parent = stack[-1][2].id if stack else (root.id if root else None)
        node = self.node(header_path, meta, parent)
        stack.append((section.level, section.title, node))
        return header_path, self.anchor(section.title), node

    def root_stub(self, root: NodeFields, at: int, text: str, header_path: str, anchor: str) -> None:
        """The declared root node's chunk when its section has no text of its own (a `# Root` heading followed
        by `## Sub`, or front matter above several `#` sections): without one the node did not exist, so
        `retrieve` missed its id and its children's parent_id dangled. Placed at the root's place in document
        order, so line ranges are still found in order."""
        before = len(self.chunks)
        self.emit(text or cap_text(self.title or self.source, TITLE_MAX_CHARS), header_path=header_path,
                  content_type="prose", language=None, node=root, anchor=anchor)
        new = self.chunks[before:]
        if new and not header_path and text:  # the front matter's title/description, not a heading
            self.from_front_matter.append(new[0])
        del self.chunks[before:]
        self.chunks[at:at] = new

    def head_text(self, front_matter: dict[str, Any]) -> str:
        """The front matter's title and description (capped): the text a document's heading-less root shows."""
        return "\n\n".join(cap_text(v, FIELD_MAX_CHARS) for k in ("title", "description")
                           if (v := scalar(front_matter.get(k))))

    def outline(self, front_matter: dict[str, Any], header_lines: list[str], node: NodeFields) -> None:
        """A document of structure only (headings, a front-matter title or description) as one chunk of that
        text: a release checklist of four headings was "no text content", skipped, and its old version
        removed. Emitted only when nothing else made a chunk, so documents with a body are unchanged."""
        head = self.head_text(front_matter)
        parts = ([head] if head else []) + (["\n".join(header_lines)] if header_lines else [])
        before = len(self.chunks)
        self.emit("\n\n".join(parts), header_path="", content_type="prose", language=None, node=node)
        if head and len(self.chunks) > before:
            self.from_front_matter.append(self.chunks[before])

    def block(self, text: str, content_type: str, language: str | None, lead: str, *, header_path: str,
              node: NodeFields, anchor: str) -> None:
        """A table or fenced code block: one chunk (with the section's lead) when it fits, else split."""
        budget = self.budget(header_path)
        whole = f"{lead}\n\n{text}" if lead else text
        if self.fits(whole, budget):
            pieces = [whole]
        elif content_type == "table":
            pieces = self.table_pieces(text, budget, lead)
        else:
            pieces = self.fence_pieces(text, budget, lead)
        for piece in pieces:
            self.emit(piece, header_path=header_path, content_type=content_type, language=language, node=node,
                      anchor=anchor)

    def _section_body(self, items: list[tuple[str, Any]], header_line: str, header_path: str, node: NodeFields,
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
            self.block(text, content_type, language, lead, **kw)
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
                if not CONTENT_SEPARATOR.match(value):  # stray separators are markup, not content
                    prose_lines.append(value)
                i += 1
        flush_prose()


def _document_meta(front_matter: dict[str, Any], preamble_meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The root node's fields (front-matter FRONT_MATTER_KEYS, then the preamble's bullets); None when the
    document does not declare itself a node."""
    declared = {k.lower(): v for k, v in front_matter.items() if k.lower() in FRONT_MATTER_KEYS}
    if preamble_meta is None and not declared:
        return None
    return {**declared, **(preamble_meta or {})}


def _title_section(sections: list[_Section], doc_meta: dict[str, Any] | None,
                   preamble: list[tuple[str, Any]]) -> int | None:
    """The index of the section that is the declared root node's own: the file's only `#` heading when
    nothing but whitespace (and metadata) precedes it, the usual layout of front matter then `# Title`. None
    when the document declares no node, has text or no `#` first, has several `#` sections (each is then a
    child of the root), or that heading names an id of its own other than the document's."""
    if doc_meta is None or len(sections) < 2 or sections[1].level != 1 or _has_text(preamble):
        return None
    if sum(1 for s in sections if s.level == 1) != 1:
        return None
    own = take_metadata(sections[1].items)[0] or {}
    if scalar(own.get("id")) and scalar(doc_meta.get("id")) and scalar(own.get("id")) != scalar(doc_meta.get("id")):
        return None
    return 1


def _has_text(items: list[tuple[str, Any]]) -> bool:
    """Whether section items hold anything but blank lines and `<!-- content -->` separators."""
    return any(kind != "line" or (value.strip() and not CONTENT_SEPARATOR.match(value)) for kind, value in items)


def _sections(text: str) -> list[_Section]:
    """Split markdown into header sections; headers inside fenced code are content, not sections.

    An unclosed fence runs to the end of the file, as CommonMark and GitHub render it; `fence_pieces` then
    splits it by lines like any code block over the budget.
    """
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
        header = _HEADER.match(line.rstrip(" \t"))
        if header:
            text = strip_closing_hashes(header.group(2) or "").strip()
            sections.append(_Section(len(header.group(1)), text, line.strip()))
        else:
            sections[-1].items.append(("line", line))
        i += 1
    return sections


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))
