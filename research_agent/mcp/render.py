"""Markdown views of tools' structured results, for clients that show only text (the structured content is
what agents read).

Nothing a tool exists to return is cut (issue 15: node content, a document's text, search hits, discovery
messages and status errors were cut at 120 characters while the structured content had all 1,392). Short
values sit in table cells or bullets; text longer than CELL_CHARS or spanning lines gets a block of its own,
and rows holding such text or nested records become one entry each instead of a table row.
"""

from __future__ import annotations

import json
from typing import Any

#: A string longer than this (or with a line break) is shown as a block, never squeezed into a cell.
CELL_CHARS = 120
#: List views: the key holding the rows, and the heading (the tool's result model; a page has `total`).
LIST_VIEWS = (("collections", "Collections"), ("projects", "Projects"), ("documents", "Documents"),
              ("knowledge_bases", "Knowledge bases"))
SEARCH_TOOLS = ("query_knowledge_base", "search_knowledge")


def _is_long(value: Any) -> bool:
    return isinstance(value, str) and (len(value) > CELL_CHARS or "\n" in value)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _inline(value: Any) -> str:
    """A short value on one line, whole: lists joined by commas, dicts as JSON."""
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    elif isinstance(value, dict):
        value = json.dumps(value, ensure_ascii=False)
    return str(value if value is not None else "")


def _cell(value: Any) -> str:
    return _inline(value).replace("|", "\\|").replace("\n", " ")


def _needs_entries(rows: list[dict[str, Any]]) -> bool:
    """Rows with long text or nested records do not fit a table without cutting them."""
    return any(_is_long(v) or isinstance(v, dict) or _is_records(v) for row in rows for v in row.values())


def _table(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _entries(rows: list[dict[str, Any]], depth: int) -> str:
    out = []
    for i, row in enumerate(rows, start=1):
        label = next((row[k] for k in ("title", "name", "document", "id") if isinstance(row.get(k), str)), "")
        out.append(f"**{i}. {label}**".rstrip() + "\n\n" + _bullets(row, depth))
    return "\n\n".join(out)


def _rows(rows: list[dict[str, Any]], depth: int = 0) -> str:
    if not rows:
        return "_none_"
    return _entries(rows, depth) if _needs_entries(rows) else _table(rows)


def _bullets(data: dict[str, Any], depth: int = 0) -> str:
    pad = "  " * depth
    lines = []
    for key, value in data.items():
        if _is_records(value):
            lines.append(f"{pad}- **{key}** ({len(value)}):\n\n{_rows(value, depth + 1)}\n")
        elif isinstance(value, (list, dict)) and not value:
            lines.append(f"{pad}- **{key}**: none")
        elif isinstance(value, dict):
            lines.append(f"{pad}- **{key}**:\n{_bullets(value, depth + 1)}")
        elif _is_long(value):
            lines.append(f"{pad}- **{key}**:\n\n{value.strip()}\n")
        else:
            lines.append(f"{pad}- **{key}**: {_inline(value)}")
    return "\n".join(lines)


def render_query(data: dict[str, Any]) -> str:
    hits = data.get("results", [])
    out = [f"## {len(hits)} result{'s' * (len(hits) != 1)} for “{data.get('query', '')}”"
           f" ({data.get('mode')}{', reranked' if data.get('reranked') else ''}; "
           f"collections: {', '.join(data.get('collections', [])) or 'none'})"]
    out += [f"> ⚠ {w}" for w in data.get("warnings", [])]
    for i, hit in enumerate(hits, start=1):
        where = " › ".join(p for p in (hit.get("source_document"), hit.get("header_path")) if p)
        out.append(f"### {i}. {where}\nrelevance {hit.get('relevance_score', 0):.2f} "
                   f"({hit.get('relevance_label')})\n\n{hit.get('content', '').strip()}")
    refinement = data.get("query_refinement") or {}
    if refinement.get("status") not in (None, "optimal"):
        out.append(f"**Query refinement ({refinement['status']})**: {refinement.get('message', '')}")
        out += [f"- {s}" for s in refinement.get("suggestions", [])]
    return "\n\n".join(out)


def _list_view(data: dict[str, Any]) -> str | None:
    """A page of a list (it carries `total`, or rows of records); a created collection's empty `projects` or a
    created project's empty `collections` is a field of that record, not a list view."""
    for key, title in LIST_VIEWS:
        value = data.get(key)
        if isinstance(value, list) and (_is_records(value) or (not value and "total" in data)):
            rest = {k: v for k, v in data.items() if k != key}
            total = data.get("total")
            count = f"{len(value)} of {total}" if isinstance(total, int) and total != len(value) else f"{len(value)}"
            return f"## {title} ({count})\n\n{_rows(value)}" + (f"\n\n{_bullets(rest)}" if rest else "")
    return None


def render(tool: str, data: dict[str, Any]) -> str:
    """A Markdown view of a tool's structured result."""
    if tool in SEARCH_TOOLS and "results" in data:
        return render_query(data)
    listed = _list_view(data)
    if listed is not None:
        return listed
    heading = {"get_status": "research-agent status", "ingest_documents": "Ingest report",
               "augment_knowledge": "Saved research"}.get(tool, tool.replace("_", " ").capitalize())
    return f"## {heading}\n\n{_bullets(data)}"
