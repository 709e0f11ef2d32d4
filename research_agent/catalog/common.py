"""What collections, projects, documents and notes all need: the `Deleted` answer, the one timestamp format and
the one paging rule for lists.

Kept apart so the import runs one way (collections -> projects -> common): projects needed these names from
collections while collections called into projects, a cycle hidden by function-local imports (issue 13).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TypeVar

from pydantic import BaseModel

from research_agent.errors import QueryError

T = TypeVar("T")
V = TypeVar("V", bound=BaseModel)

#: Items in a list page when the caller gives no limit. One `manage_documents list` of 400 documents was 258 KB
#: and one collection list 719 KB (issue 15); 100 rows keep a default answer near 8k tokens (~32 KB).
DEFAULT_PAGE = 100
#: The largest page a caller may ask for: a list answer stays bounded whatever the limit says.
MAX_PAGE = 1000
#: A default page also ends once its items reach this many bytes of JSON: 100 documents with ~70-character
#: paths were 49.8 KB (each path is stored three times), over the ~32 KB an 8k-token answer allows. An explicit
#: `limit` is honoured as asked (up to MAX_PAGE).
DEFAULT_PAGE_BYTES = 24_000

_CURSOR_VERSION = 1


class Deleted(BaseModel):
    deleted: str
    kind: str
    chunks_removed: int = 0


class Page(BaseModel):
    """One page of a list: `total` items match; `next_cursor` fetches the next page (None on the last)."""

    total: int
    next_cursor: str | None = None


def now_iso() -> str:
    """UTC, to the second (e.g. 2026-11-24T01:18:00+00:00): what every record's created_at holds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def encode_cursor(kind: str, after: str) -> str:
    """An opaque cursor: the list it belongs to and the last key shown (keyset paging, so an item added or
    removed between two calls never makes the next page repeat or skip the others)."""
    raw = json.dumps({"v": _CURSOR_VERSION, "k": kind, "a": after}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _bad_cursor(kind: str, cursor: str, why: str) -> QueryError:
    return QueryError(f"Invalid cursor for the {kind} list: {why}",
                      guidance="Pass the next_cursor of the previous page unchanged, or leave cursor out to start "
                               "from the first page.",
                      cursor=cursor[:80], argument="cursor")


def decode_cursor(kind: str, cursor: str) -> str:
    """The last key the previous page showed; a cursor that is not ours (or another list's) is a QueryError."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        data = json.loads(text)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):  # 100000 `[` overflow json's parser
        raise _bad_cursor(kind, cursor, "it is not a cursor this server returned") from None
    if not isinstance(data, dict) or data.get("v") != _CURSOR_VERSION or not isinstance(data.get("a"), str):
        raise _bad_cursor(kind, cursor, "it is not a cursor this server returned")
    if data.get("k") != kind:
        raise _bad_cursor(kind, cursor, f"it belongs to the {str(data.get('k'))[:80]!r} list")
    return data["a"]


def check_limit(limit: int | None) -> int:
    """The page size: DEFAULT_PAGE when None; outside 1..MAX_PAGE it is a QueryError."""
    if limit is None:
        return DEFAULT_PAGE
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"limit must be between 1 and {MAX_PAGE}, got {limit!r}",
                         guidance=f"Pass a limit from 1 to {MAX_PAGE} (default {DEFAULT_PAGE}) and page on with "
                                  "next_cursor.", argument="limit")
    return limit


def paginate(items: Sequence[T], key: Callable[[T], str], kind: str, view: Callable[[T], V], *,
             limit: int | None, cursor: str | None) -> tuple[list[V], Page]:
    """One page of `items` in key order after the key `cursor` names, each turned into its `view` (only the
    page's items are viewed), with the total and the next cursor.

    `kind` names the list (e.g. "collections", "documents:notes") so a cursor cannot be replayed on another.
    A default page (limit None) holds DEFAULT_PAGE items or DEFAULT_PAGE_BYTES of JSON, whichever is less.
    """
    size = check_limit(limit)
    budget = DEFAULT_PAGE_BYTES if limit is None else None
    ordered = sorted(items, key=key)
    rest = ordered
    if cursor:
        after = decode_cursor(kind, cursor)
        rest = [item for item in ordered if key(item) > after]
    shown: list[V] = []
    used = 0
    for item in rest[:size]:
        viewed = view(item)
        used += len(viewed.model_dump_json())
        if shown and budget is not None and used > budget:
            break
        shown.append(viewed)
    more = len(rest) > len(shown)
    last = key(rest[len(shown) - 1]) if shown else ""
    return shown, Page(total=len(ordered), next_cursor=encode_cursor(kind, last) if more else None)
