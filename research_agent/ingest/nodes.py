"""The Markdown-JSON hybrid node format, and the one definition of a node's fields: names, types,
defaults, how each value parses, and the chunk metadata key each is stored under.

    ## Retry the upload
    - id: task-upload-retry
    - type: task
    - blocked_by: [task-auth, task-quota]
    <!-- content -->
    Body text ...

This module reads that block (which bullets are metadata, how values parse) into `NodeFields`, writes a
node into a chunk's Chroma metadata (`to_metadata`, capped) and reads it back (`from_metadata`);
chunking.py decides where sections and chunks begin and hands each chunk its `NodeFields`. Issue 13 found
the fields spelled out five times (the chunk's copy, prepare's metadata, discovery's reader, two wire
dicts); they are named only here, discovery included (it reads nodes back through `from_metadata` and
builds its wire dicts from `STORED_KEYS`; tests/test_chunking.py::test_the_node_schema_is_defined_once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

CONTENT_SEPARATOR = re.compile(r"^[ \t]*<!--[ \t]*content[ \t]*-->[ \t]*$", re.IGNORECASE)
#: Matched on the line without trailing blanks (a lazy value before `[ \t]*$` backtracked quadratically on a
#: long run of blanks: 18 s at 100 KB); keys are at most 64 characters, so the key's overlap with the
#: emphasis marks cannot either (tests/test_ingest_text_linear.py).
_META_BULLET = re.compile(r"^ {0,3}[-*+][ \t]+[*_`]*([A-Za-z][\w-]{0,63})[*_`]*[ \t]*:(?:[ \t]+(.*))?$")
_LIST_CONTINUATION = re.compile(r"^([ \t]+\S|[ \t]{0,3}([-*+]|\d+[.)])[ \t])")

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
class NodeFields:
    """The node fields of a section (generated id when it gave none); `extra` holds the other keys."""

    id: str
    type: str | None = None
    status: str | None = None
    parent_id: str | None = None
    blocked_by: list[str] = field(default_factory=list)
    last_checked: str | None = None
    labels: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


#: The chunk metadata key each NodeFields field is stored under (all but `extra`): the one list.
STORED_KEYS: dict[str, str] = {
    "id": "node_id", "type": "node_type", "status": "status", "parent_id": "parent_id",
    "blocked_by": "blocked_by", "last_checked": "last_checked", "labels": "labels",
}
#: Hybrid bullets kept in `extra` that are stored too, under their own key (discovery's title and description).
STORED_EXTRA_KEYS: dict[str, str] = {"title": "node_title", "description": "node_description"}
#: Front-matter keys that describe the node of the text before the first header.
FRONT_MATTER_KEYS = ("id", "type", "status")
_LIST_FIELDS = frozenset(f.name for f in fields(NodeFields) if f.name in STORED_KEYS and f.default_factory is list)


def to_metadata(node: NodeFields) -> dict[str, Any]:
    """The node's chunk metadata, capped like everything a chunk repeats (chunking's *_MAX_* constants);
    ids, types and statuses are capped alike so references still match. Empty values are left out."""
    from research_agent.ingest.chunking import FIELD_MAX_CHARS, LIST_ITEM_MAX_CHARS, cap_list, cap_text

    meta: dict[str, Any] = {}
    for name, key in STORED_KEYS.items():
        value = getattr(node, name)
        if name in _LIST_FIELDS:
            meta[key] = cap_list(list(value)) or None
        else:
            meta[key] = cap_text(value, LIST_ITEM_MAX_CHARS) if isinstance(value, str) else value
    for name, key in STORED_EXTRA_KEYS.items():
        value = node.extra.get(name)
        if isinstance(value, str) and value:
            meta[key] = cap_text(value, FIELD_MAX_CHARS)
    return {k: v for k, v in meta.items() if v is not None}


def from_metadata(meta: dict[str, Any]) -> NodeFields:
    """The node a stored chunk's metadata describes (the inverse of to_metadata); `id` is "" when the chunk
    was stored without one (the caller derives it, e.g. from the anchor)."""
    values: dict[str, Any] = {name: meta.get(key) for name, key in STORED_KEYS.items()}
    for name in _LIST_FIELDS:
        values[name] = list(values[name] or [])
    values["id"] = values["id"] or ""
    extra = {name: meta[key] for name, key in STORED_EXTRA_KEYS.items() if meta.get(key)}
    return NodeFields(**values, extra=extra)


def node_fields(meta: dict[str, Any] | None, generated_id: str, parent_id: str | None) -> NodeFields:
    """The node a section's metadata describes; `parent_id` (the enclosing node) unless it names its own."""
    meta = dict(meta or {})
    node_id = scalar(meta.pop("id", None)) or generated_id
    explicit_parent = scalar(meta.pop("parent_id", None)) or scalar(meta.pop("parent", None))
    return NodeFields(
        id=node_id,
        type=scalar(meta.pop("type", None)),
        status=scalar(meta.pop("status", None)),
        parent_id=explicit_parent or parent_id,
        blocked_by=as_list(meta.pop("blocked_by", [])),
        last_checked=scalar(meta.pop("last_checked", None)),
        labels=as_list(meta.pop("labels", [])) + as_list(meta.pop("label", [])),
        extra=meta,
    )


def take_metadata(items: list[tuple[str, Any]]) -> tuple[dict[str, Any] | None, list[tuple[str, Any]]]:
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
        if j < n and items[j][0] == "line" and CONTENT_SEPARATOR.match(items[j][1]):
            i, seen_separator = j + 1, True
            continue
        k, run = j, []
        while k < n and items[k][0] == "line" and (m := _META_BULLET.match(items[k][1].rstrip(" \t"))):
            run.append((m.group(1).lower().replace("-", "_"), m.group(2) or ""))
            k += 1
        if not run or (k < n and items[k][0] == "line" and _LIST_CONTINUATION.match(items[k][1])):
            break  # no bullets, or an ordinary list that goes on with non key-value items
        after = skip_blank(k)
        separated = after < n and items[after][0] == "line" and bool(CONTENT_SEPARATOR.match(items[after][1]))
        if not separated and (seen_separator or not looks_like_metadata(run)):
            break
        for key, value in run:  # duplicate keys and repeated blocks: the last value wins
            meta[key] = parse_value(key, value)
        found = True
        i = after + 1 if separated else k
        seen_separator = seen_separator or separated
    return (meta if found else None), items[i:]


def looks_like_metadata(run: list[tuple[str, str]]) -> bool:
    keys = {key for key, _ in run}
    if not keys & KNOWN_METADATA_KEYS:
        return False
    values = {key: value.strip() for key, value in run}
    if "id" in values and not re.fullmatch(r"[\w.:/#@+\-'\"`]+", values["id"]):
        return False
    return all(len(values[k].split()) <= 2 for k in _TOKEN_VALUED_KEYS & keys)


def parse_value(key: str, value: str) -> Any:
    value = value.strip()
    if key in _LIST_KEYS or (value.startswith("[") and value.endswith("]")):
        return as_list(value)
    return unquote(value)


def unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        return value[1:-1].strip()
    return value


def as_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    value = str(value or "").strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    items = (unquote(v) for v in value.split(","))
    return [v for v in items if v.lower() not in _EMPTY_VALUES]


def scalar(value: Any) -> str | None:
    if isinstance(value, list):
        value = ", ".join(value)
    text = str(value).strip() if value is not None else ""
    return text or None
