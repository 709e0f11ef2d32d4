"""Code chunks at syntax-tree boundaries: one chunk per function, method or class, named by its symbol path.

`code_chunks` parses a code file with tree-sitter and cuts it where definitions start and end, so a chunk holds
a whole function with its signature, decorators, doc comment and docstring, and its `symbol_path` says where it
lives (`module > Class > method`). It returns None (the caller falls back to the regex split of
chunking.Chunker.code) for a language without a grammar here, when the grammar packages are not installed or
do not load (one log line per language), for a file over MAX_TREE_BYTES, and for a parse whose error nodes
cover over MAX_ERROR_SHARE of the file.

Units: top-level definitions and the module-level code between them (imports, constants: one "module" unit
per run). A definition with no room in one chunk is split: a container (class, impl, trait, namespace) into
its members, each chunk after the first opening with the container's signature line(s) and its docstring's
first line; a function (or a run of module code) by lines, each later piece opening with its signature again.
No packing: each definition is its own chunk however small, so that a hit names one symbol and cites its lines
(packing neighbours up to the budget was not measured). Comments and attributes
(`#[derive]`, `///`, JSDoc) right above a definition, with no blank line between, belong to it.

Lines: `line_start`/`line_end` (1-based, inclusive) are the file lines of the piece's own text, which is
exactly those lines; a repeated signature or class line is context put before them. Every non-blank line of
the file is in exactly one piece, except a line too long for any chunk, cut into runs that each cite it
(tests/test_code_chunks.py checks both on every fixture).

Bounds: the tree is read by iterating children, never by recursion over its depth: containers are entered
to MAX_CONTAINER_DEPTH levels, and the error share is counted on the top two levels, so 10,000 nested brackets
cost one parse (tree-sitter's own stack is on the heap) and a loop.

Over 400 lines (~430): the per-grammar table and one `_Cutter` whose unit, size and split steps share the
file's lines, bytes and budget; the table is the part to move out when more languages come.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

from research_agent.ingest.chunking import LIST_ITEM_MAX_CHARS, MAX_CHUNK_BYTES, TokenCounter

log = logging.getLogger(__name__)

#: Files over this many bytes go to the regex split: 5.5 MB of generated Python (240,000 functions) took 2.9 s
#: to parse alone, 2.9 M nodes; at 1 MB (43,000 functions) parse and cut take 1.3 s, ~25k lines of real code.
MAX_TREE_BYTES = 1 << 20
#: A parse whose ERROR nodes (top two levels) cover more than this share of the file's bytes is not trusted:
#: tree-sitter recovers locally, so a few broken lines are fine, but a file in another dialect is not.
MAX_ERROR_SHARE = 0.25
#: How deep containers are entered (module > namespace > class > inner class > method); deeper code is split
#: by lines inside the innermost entered unit.
MAX_CONTAINER_DEPTH = 4
#: Whether a split piece opens with its class and function signature lines (context that is not in its line
#: range). Off: `kb get` places a chunk's lines on its range, and repeated lines outside it showed `class X:`
#: where the file has `def f` (outside tester); the embedding gets the symbol path anyway (header path, prepended
#: by prepare.embedding_text), and benchmarks/code_search.py measures repetition within noise (hit@1 0.393 vs
#: 0.374, standard error ~0.025).
REPEAT_CONTEXT = False
#: The most characters of a signature repeated before a split piece (a 40-parameter C++ template is cut).
SIGNATURE_MAX_CHARS = 300


@dataclass(frozen=True)
class CodePiece:
    """One chunk of a code file: `text` (context lines, then the file's lines line_start..line_end, 1-based)."""

    text: str
    symbol_path: str
    line_start: int
    line_end: int
    kind: str  # "function" (any non-container definition), "class" (container or code inside it), "module"


@dataclass(frozen=True)
class Grammar:
    """Node types of one grammar: definitions kept whole, containers split into members, wrappers around a
    definition (decorators, `export`, `template<>`), and nodes that belong to the definition below them."""

    module: str
    entry: str
    functions: frozenset[str]
    containers: frozenset[str] = frozenset()
    wrappers: frozenset[str] = frozenset()
    attached: frozenset[str] = frozenset({"comment"})


def _g(module: str, functions: str, containers: str = "", wrappers: str = "", attached: str = "comment",
       entry: str = "language") -> Grammar:
    return Grammar(module, entry, frozenset(functions.split()), frozenset(containers.split()),
                   frozenset(wrappers.split()), frozenset(attached.split()))


_JS_FUNCTIONS = ("function_declaration generator_function_declaration method_definition lexical_declaration "
                 "variable_declaration")
_TS_FUNCTIONS = (_JS_FUNCTIONS + " interface_declaration type_alias_declaration enum_declaration "
                 "function_signature abstract_method_signature method_signature")
_C_FUNCTIONS = "function_definition struct_specifier enum_specifier union_specifier type_definition"

#: The node types per grammar (one table, as the tree-sitter grammars name them).
GRAMMARS: dict[str, Grammar] = {
    "python": _g("tree_sitter_python", "function_definition", "class_definition", "decorated_definition"),
    "javascript": _g("tree_sitter_javascript", _JS_FUNCTIONS, "class_declaration class", "export_statement"),
    "typescript": _g("tree_sitter_typescript", _TS_FUNCTIONS, "class_declaration abstract_class_declaration "
                     "internal_module module", "export_statement", entry="language_typescript"),
    "go": _g("tree_sitter_go", "function_declaration method_declaration type_declaration"),
    "rust": _g("tree_sitter_rust", "function_item function_signature_item struct_item enum_item union_item "
               "type_item macro_definition", "impl_item trait_item mod_item",
               attached="line_comment block_comment attribute_item inner_attribute_item"),
    "java": _g("tree_sitter_java", "method_declaration constructor_declaration compact_constructor_declaration "
               "annotation_type_declaration", "class_declaration interface_declaration enum_declaration "
               "record_declaration", attached="line_comment block_comment"),
    "c": _g("tree_sitter_c", _C_FUNCTIONS),
    "cpp": _g("tree_sitter_cpp", "function_definition enum_specifier union_specifier type_definition "
              "alias_declaration", "class_specifier struct_specifier namespace_definition",
              "template_declaration"),
}
#: JS/TS declarations that are definitions only when they bind a function or class (`const f = () => …`).
_BINDINGS = frozenset({"lexical_declaration", "variable_declaration"})
_FUNCTION_VALUES = frozenset({"arrow_function", "function_expression", "function", "generator_function",
                              "class"})
_NAME_TYPES = frozenset({"identifier", "field_identifier", "qualified_identifier", "type_identifier",
                         "operator_name", "destructor_name", "property_identifier"})

#: How a docstring's first line starts: the part of a class's context dropped first when it is too long.
_DOC_OPENERS = ('"""', "'''", "r\"\"\"", "/**", "///", "//", "#", "/*")
Budget = Callable[[str], int]


@functools.lru_cache(maxsize=None)
def _parser(language: str) -> Any | None:
    """A tree-sitter parser for `language`, or None (logged once) when its grammar package does not load:
    not installed, or a wheel built for a newer glibc than this machine's (an ImportError from the loader)."""
    grammar = GRAMMARS[language]
    try:
        import tree_sitter

        module = importlib.import_module(grammar.module)
        return tree_sitter.Parser(tree_sitter.Language(getattr(module, grammar.entry)()))
    except Exception as exc:  # ImportError, OSError (glibc), ValueError (ABI version): all mean "fall back"
        log.warning("code chunks by syntax tree are off for %s (%s: %s); splitting by blank lines instead",
                    language, type(exc).__name__, exc)
        return None


def code_chunks(text: str, language: str | None, max_tokens: int | Budget, count_tokens: TokenCounter, *,
                module: str = "", max_bytes: int = MAX_CHUNK_BYTES) -> list[CodePiece] | None:
    """`text` cut at definitions (module docstring), each piece within its token budget and `max_bytes`;
    None when the caller should fall back to the regex split.

    max_tokens: a budget, or a function of the piece's symbol path (the path is embedded with the chunk);
    module: the first part of every symbol path (the file's stem)."""
    if language not in GRAMMARS or not text.strip() or len(text) > MAX_TREE_BYTES:
        return None
    source = text.encode("utf-8")
    if len(source) > MAX_TREE_BYTES or (parser := _parser(language)) is None:
        return None
    try:
        tree = parser.parse(source)
    except Exception as exc:  # a parser bug must cost the file its tree chunks, not its ingest
        log.warning("tree-sitter could not parse a %s file (%s); splitting by blank lines", language, exc)
        return None
    if tree is None or _error_share(tree.root_node, len(source)) > MAX_ERROR_SHARE:
        return None
    budget = max_tokens if callable(max_tokens) else (lambda _path, n=max_tokens: n)
    cutter = _Cutter(text.split("\n"), source, GRAMMARS[language], budget, count_tokens, max_bytes)
    units = cutter.units(tree.root_node.children, 0, len(cutter.lines) - 1, module, "module", 0)
    return [piece for unit in units for piece in cutter.fit(unit, "")]


def module_name(source: str) -> str:
    """The module part of a symbol path: the file's stem (`pkg/sessions.py` -> `sessions`)."""
    return source.replace("\\", "/").rsplit("/", 1)[-1].split(".", 1)[0]


def _error_share(root: Any, total: int) -> float:
    """Share of the file's bytes under ERROR (or missing) nodes among the root's children and grandchildren."""
    if not root.has_error or total == 0:
        return 0.0
    bad = 0
    for child in root.children:
        if child.is_error or child.is_missing:
            bad += child.end_byte - child.start_byte
            continue
        bad += sum(g.end_byte - g.start_byte for g in child.children if g.is_error or g.is_missing)
    return bad / total


@dataclass
class _Unit:
    start: int  # 0-based rows, inclusive
    end: int
    path: str
    kind: str
    node: Any = None  # the definition (wrappers removed); None for code between definitions
    depth: int = 0


class _Cutter:
    def __init__(self, lines: list[str], source: bytes, grammar: Grammar, budget: Budget,
                 count: TokenCounter, max_bytes: int) -> None:
        self.lines = lines
        self.source = source
        self.grammar = grammar
        self.budget = budget
        self.count = count
        self.max_bytes = max_bytes

    # -- units ------------------------------------------------------------------------------------------

    def units(self, children: list[Any], lo: int, hi: int, path: str, gap_kind: str, depth: int) -> list[_Unit]:
        """Rows lo..hi as definition units (with the comments right above them) and the code between."""
        out: list[_Unit] = []
        cursor = lo
        for start, node, inner in self._definitions(children):
            start, end = max(start, cursor), node.end_point[0]
            if start > end or end > hi:
                continue  # shares its only line with the previous unit, or lies past the container
            if start > cursor:
                self._gap(out, cursor, start - 1, path, gap_kind, depth)
            name = self._name(inner)
            out.append(_Unit(start, end, f"{path} > {name}" if path else name,
                             "class" if inner.type in self.grammar.containers else "function", inner, depth))
            cursor = end + 1
        if cursor <= hi:
            self._gap(out, cursor, hi, path, gap_kind, depth)
        return out

    def _definitions(self, children: list[Any]) -> list[tuple[int, Any, Any]]:
        """(first row, node, definition) of each definition among `children`; first row is that of the
        comments and attributes directly above it (no blank line between)."""
        found: list[tuple[int, Any, Any]] = []
        run_start = run_end = -2
        for child in children:
            if child.type in self.grammar.attached:
                if child.start_point[0] > run_end + 1:
                    run_start = child.start_point[0]
                run_end = child.end_point[0]
                continue
            inner = self._unwrap(child)
            if inner is not None:
                above = run_start if 0 <= child.start_point[0] - run_end <= 1 else child.start_point[0]
                found.append((above, child, inner))
            run_start = run_end = -2
        return found

    def _unwrap(self, node: Any) -> Any | None:
        """The definition `node` is or wraps (decorators, export, template), or None."""
        for _ in range(3):  # `export default` around `@decorator` around a class is as deep as it goes
            if node.type not in self.grammar.wrappers:
                break
            inner = (node.child_by_field_name("definition") or node.child_by_field_name("declaration")
                     or (node.named_children[-1] if node.named_children else None))
            if inner is None:
                return None
            node = inner
        if node.type in _BINDINGS:
            return node if any(d.child_by_field_name("value") is not None
                               and d.child_by_field_name("value").type in _FUNCTION_VALUES
                               for d in node.named_children) else None
        return node if node.type in self.grammar.functions or node.type in self.grammar.containers else None

    def _gap(self, out: list[_Unit], start: int, end: int, path: str, kind: str, depth: int) -> None:
        """Code between definitions as its own unit; blank lines are dropped and a run of closing brackets
        joins the unit before it (a lone `}` is no chunk)."""
        rows = [r for r in range(start, end + 1) if self.lines[r].strip()]
        if not rows:
            return
        if out and not any(ch.isalnum() for r in rows for ch in self.lines[r]):
            out[-1].end = rows[-1]
            return
        out.append(_Unit(rows[0], rows[-1], path, kind, None, depth))

    def _name(self, node: Any) -> str:
        """The symbol a definition declares: its name field, a C declarator's identifier, an impl's type."""
        name = node.child_by_field_name("name")
        if name is None and node.type == "impl_item":
            name = node.child_by_field_name("type")
        if name is None and node.type in _BINDINGS | {"type_declaration"} and node.named_children:
            name = node.named_children[0].child_by_field_name("name")
        declarator = node
        for _ in range(8):  # int *(*f)(void): pointer, function, parenthesized ... declarators
            if name is not None or (declarator := declarator.child_by_field_name("declarator")) is None:
                break
            if declarator.type in _NAME_TYPES:
                name = declarator
        text = self._text(name) if name is not None else self.lines[node.start_point[0]].strip()
        text = " ".join(text.split())[:LIST_ITEM_MAX_CHARS] or node.type
        receiver = self._receiver(node)
        return f"{receiver} > {text}" if receiver else text

    def _receiver(self, node: Any) -> str:
        """A Go method's receiver type (`func (q *Queue) Pop()` -> `Queue`): the method's class in its path."""
        found = node.child_by_field_name("receiver") if node.type == "method_declaration" else None
        for _ in range(6):  # parameter_list > parameter_declaration > pointer_type > generic_type > type_identifier
            if found is None or found.type == "type_identifier":
                break
            found = found.child_by_field_name("type") or (found.named_children[0] if found.named_children else None)
        return self._text(found)[:LIST_ITEM_MAX_CHARS] if found is not None and found.type == "type_identifier" else ""

    def _text(self, node: Any) -> str:
        return self.source[node.start_byte:node.end_byte].decode("utf-8", "replace")

    def signature(self, node: Any) -> str:
        """A definition's text up to its body (`def f(a, b) -> int:`, `class Foo(Base):`), and for a class its
        docstring's first line, capped at SIGNATURE_MAX_CHARS."""
        body = node.child_by_field_name("body")
        start = node.start_byte - node.start_point[1]  # from the line's start: keeps the indentation
        # The head ends with the last token before the body that is not a comment (Python's block starts at
        # its first statement, after any comment lines).
        ends = [c.end_byte for c in node.children if c.end_byte <= (body.start_byte if body else 0)
                and c.type not in self.grammar.attached]
        if body is None or not ends:
            head = self.lines[node.start_point[0]]
        else:
            head = self.source[start:ends[-1]].decode("utf-8", "replace").rstrip()
        doc = self._docstring_line(body) if node.type in self.grammar.containers and body is not None else ""
        return (head[:SIGNATURE_MAX_CHARS] + ("\n" + doc if doc else "")).strip("\n")

    def _docstring_line(self, body: Any) -> str:
        """The first line of a Python docstring opening `body`, indented as in the file ("" when none)."""
        first = body.named_children[0] if body.named_children else None
        if first is None or first.type != "expression_statement" or first.named_children[:1] == []:
            return ""
        if first.named_children[0].type != "string":
            return ""
        return self.lines[first.start_point[0]][:SIGNATURE_MAX_CHARS]

    # -- sizes ------------------------------------------------------------------------------------------

    def fits(self, text: str, budget: int) -> bool:
        if len(text.encode("utf-8")) > self.max_bytes:
            return False
        return self.count([text])[0] <= budget

    def piece(self, unit: _Unit, start: int, end: int, context: str) -> CodePiece:
        body = "\n".join(self.lines[start:end + 1])
        context = context if REPEAT_CONTEXT else ""
        return CodePiece(f"{context}\n{body}" if context else body, unit.path, start + 1, end + 1, unit.kind)

    def fit(self, unit: _Unit, context: str) -> list[CodePiece]:
        """The unit as one piece when it fits, else its members (a container) or its lines (anything else)."""
        budget = self.budget(unit.path)
        context = self.shrink(context, budget // 4)
        whole = self.piece(unit, unit.start, unit.end, context)
        if self.fits(whole.text, budget):
            return [whole]
        if unit.node is not None and unit.node.type in self.grammar.containers and unit.depth < MAX_CONTAINER_DEPTH:
            members = self._members(unit)
            if members is not None:
                inner = "\n".join(p for p in (context, self.signature(unit.node)) if p)
                return [p for i, m in enumerate(members) for p in self.fit(m, context if i == 0 else inner)]
        again = context
        if unit.node is not None:  # the signature again, with the class line(s) when both are short enough
            sig = self.signature(unit.node)
            again = next((c for c in ("\n".join(p for p in (context, sig) if p), sig)
                          if c and self.fits(c, budget // 4)), context)
        return self.by_lines(unit, context, again)

    def shrink(self, context: str, budget: int) -> str:
        """`context` within `budget` tokens: whole, else without its docstring lines, else its first line, else
        nothing (signatures this long would crowd out the code they introduce)."""
        lines = context.split("\n")
        bare = "\n".join(line for line in lines if not line.lstrip().startswith(_DOC_OPENERS))
        return next((c for c in (context, bare, lines[0]) if c and self.fits(c, budget)), "")

    def _members(self, unit: _Unit) -> list[_Unit] | None:
        """The container's rows as its members and the code between them; None when it has no member."""
        body = unit.node.child_by_field_name("body")
        if body is None:
            return None
        members = self.units(body.children, unit.start, unit.end, unit.path, "class", unit.depth + 1)
        if not any(m.node is not None for m in members):
            return None
        return members

    def by_lines(self, unit: _Unit, first: str, again: str) -> list[CodePiece]:
        """The unit's rows packed into pieces within the budget; `first` opens the first piece and `again`
        the others (the signature, repeated). A line too long for any piece is cut into runs of characters."""
        budget = self.budget(unit.path)
        costs = {c: (self.count([c])[0] + 1 if c else 0) for c in (first, again)}
        rows = list(range(unit.start, unit.end + 1))
        out: list[CodePiece] = []
        group: list[int] = []
        used = nbytes = 0
        for row, size in zip(rows, self.count([self.lines[r] for r in rows])):
            context = again if out else first
            width = len(self.lines[row].encode("utf-8")) + 1
            if group and (used + size > budget - costs[context] or nbytes + width > self.max_bytes // 2):
                out += self._checked(unit, group, context)
                group, used, nbytes = [], 0, 0
            group.append(row)
            used, nbytes = used + size, nbytes + width
        if group:
            out += self._checked(unit, group, again if out else first)
        return out

    def _checked(self, unit: _Unit, rows: list[int], context: str) -> list[CodePiece]:
        """Pieces of `rows` (blank edge rows dropped) each verified with the real count: halved until they fit;
        a single line still too long is cut into runs of characters."""
        while rows and not self.lines[rows[-1]].strip():
            rows = rows[:-1]
        while rows and not self.lines[rows[0]].strip():
            rows = rows[1:]
        if not rows:
            return []
        piece = self.piece(unit, rows[0], rows[-1], context)
        budget = self.budget(unit.path)
        if self.fits(piece.text, budget):
            return [piece]
        if len(rows) > 1:
            mid = len(rows) // 2
            return self._checked(unit, rows[:mid], context) + self._checked(unit, rows[mid:], context)
        if context:
            return self._checked(unit, rows, "")
        return self._line_runs(unit, rows[0], budget)

    def _line_runs(self, unit: _Unit, row: int, budget: int) -> list[CodePiece]:
        """One line too long for a chunk (minified code, a data blob) as runs of characters, each citing it."""
        line, out, pos = self.lines[row], [], 0
        step = max(1, min(len(line), self.max_bytes // 4, budget * 4))
        while pos < len(line):
            run = line[pos:pos + step]
            while step > 1 and not self.fits(run, budget):
                step = max(1, step // 2)
                run = line[pos:pos + step]
            if run.strip():
                out.append(CodePiece(run, unit.path, row + 1, row + 1, unit.kind))
            pos += len(run)
        return out
