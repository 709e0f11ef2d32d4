"""Markdown views of tools' structured results, for clients that show only text (the structured content is
what agents read). Cells are cut at 120 characters so a table stays one line per row."""

from __future__ import annotations

import json
from typing import Any


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    elif isinstance(value, dict):
        value = json.dumps(value, ensure_ascii=False)
    return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")[:120]


def _table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "_none_"
    columns = columns or [k for k, v in rows[0].items() if not isinstance(v, (dict, list)) or k in ("projects",)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _bullets(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"- **{key}**:\n\n" + _table(value) + "\n")
        elif isinstance(value, (list, dict)) and not value:
            lines.append(f"- **{key}**: none")
        else:
            lines.append(f"- **{key}**: {_cell(value)}")
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


def render(tool: str, data: dict[str, Any]) -> str:
    """A Markdown view of a tool's structured result."""
    if tool == "query_knowledge_base":
        return render_query(data)
    for key, title in (("collections", "Collections"), ("projects", "Projects"), ("documents", "Documents")):
        value = data.get(key)
        if isinstance(value, list) and (not value or isinstance(value[0], dict)):
            rest = {k: v for k, v in data.items() if k != key}
            return f"## {title} ({len(value)})\n\n{_table(value)}" + (f"\n\n{_bullets(rest)}" if rest else "")
    heading = {"get_status": "research-agent status", "ingest_documents": "Ingest report",
               "augment_knowledge": "Saved research"}.get(tool, tool.replace("_", " ").capitalize())
    return f"## {heading}\n\n{_bullets(data)}"
