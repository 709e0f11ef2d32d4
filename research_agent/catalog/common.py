"""What collections, projects and notes all need: the `Deleted` answer and the one timestamp format.

Kept apart so the import runs one way (collections -> projects -> common): projects needed these two
names from collections while collections called into projects, a cycle hidden by function-local imports
(issue 13).
"""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import BaseModel


class Deleted(BaseModel):
    deleted: str
    kind: str
    chunks_removed: int = 0


def now_iso() -> str:
    """UTC, to the second (e.g. 2026-11-24T01:18:00+00:00): what every record's created_at holds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
