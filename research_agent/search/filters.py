"""Metadata filters of a query: validation, the Chroma `where` clause and the same test for the keyword side.

Both retrievers must apply one filter identically (a dense hit the keyword side would reject, or the
reverse, changes the fused list), so the clause and the predicate are built here from one table.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from research_agent.errors import QueryError

#: Filter name -> chunk metadata field. `tags` and `keywords` both match front-matter keywords/tags.
FILTER_FIELDS = {"content_type": "content_type", "kind": "kind", "node_type": "node_type", "status": "status",
                 "tags": "keywords", "keywords": "keywords", "code_language": "code_language",
                 "document": "source_document", "collection": "collection"}
_LIST_FIELDS = {"keywords"}
#: Bounds on a filter: values per field and characters per value. Chroma's SQLite store fails on about
#: 32,000 values ("too many SQL variables", a -32000) and the keyword side tests each chunk against each
#: value, so a list far past any real need is a mistake to report, not to run.
MAX_FILTER_VALUES = 100
MAX_FILTER_VALUE_CHARS = 500


def _filter_error(key: str, problem: str) -> QueryError:
    return QueryError(f"Filter {key!r} {problem}", filter=str(key)[:100],
                      guidance=f"Give text values, one or a list of up to {MAX_FILTER_VALUES}: for example "
                               f"{{\"{key}\": \"value\"}} or {{\"{key}\": [\"a\", \"b\"]}}. Operators such as "
                               "$in or $ne are not supported.")


def _filter_value(key: str, value: Any) -> str:
    """One filter value as the text it matches: every filter field holds text, so a whole number matches its
    digits ({"tags": 3} finds the keyword "3") in every mode alike; other types are errors rather than
    values that Chroma rejects on the dense side (mixed types, NaN) and the keyword side silently misses."""
    if isinstance(value, str):
        if len(value) > MAX_FILTER_VALUE_CHARS:
            raise _filter_error(key, f"has a value of {len(value)} characters; the limit is {MAX_FILTER_VALUE_CHARS}")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    shown = f" ({value})" if isinstance(value, float) else ""  # never str() a nested list: it may be huge
    raise _filter_error(key, f"has a value of type {type(value).__name__}{shown}; values are text or whole numbers")


def validate_filters(filters: Any) -> dict[str, list[str]]:
    """{name: [accepted values as text]} from a filters dict; a value may be one value or a list (any of)."""
    if filters is None:
        return {}
    if not isinstance(filters, dict):
        raise QueryError("filters must be a mapping of field to value",
                         guidance=f"For example {{\"content_type\": \"code_block\"}}; "
                                  f"fields: {', '.join(FILTER_FIELDS)}.")
    out: dict[str, list[str]] = {}
    for key, value in filters.items():
        if key not in FILTER_FIELDS:
            raise QueryError(f"Unknown filter {key!r}", filter=str(key)[:100],
                             guidance=f"Filter on one of: {', '.join(FILTER_FIELDS)}.")
        values = list(value) if isinstance(value, (list, tuple, set)) else [value]
        if len(values) > MAX_FILTER_VALUES:
            raise _filter_error(key, f"has {len(values)} values; the limit is {MAX_FILTER_VALUES}")
        values = [_filter_value(key, v) for v in values if v is not None]
        if not values:
            raise _filter_error(key, "needs a value")
        out[key] = list(dict.fromkeys(values))
    return out


def chroma_where(filters: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The Chroma `where` clause for validated filters (collection is applied by choosing collections)."""
    clauses: list[dict[str, Any]] = []
    for key, values in filters.items():
        fld = FILTER_FIELDS[key]
        if key == "collection":
            continue
        if fld in _LIST_FIELDS:
            ors = [{fld: {"$contains": v}} for v in values]
            clauses.append(ors[0] if len(ors) == 1 else {"$or": ors})
        else:
            clauses.append({fld: values[0]} if len(values) == 1 else {fld: {"$in": values}})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def metadata_predicate(filters: dict[str, list[Any]]) -> Callable[[dict[str, Any]], bool] | None:
    """The same filters as a test on a chunk's metadata (for the keyword index)."""
    checks = [(FILTER_FIELDS[k], set(v)) for k, v in filters.items() if k != "collection"]
    if not checks:
        return None

    def accept(meta: dict[str, Any]) -> bool:
        for fld, wanted in checks:
            have = meta.get(fld)
            if fld in _LIST_FIELDS:
                if not isinstance(have, list) or not wanted.intersection(have):
                    return False
            elif have not in wanted:
                return False
        return True

    return accept
