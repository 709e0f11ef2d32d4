"""The change log's records (storage/registry.py): every revision bump is announced by one."""

from __future__ import annotations

from research_agent.storage.registry import announced


def test_a_bump_without_a_change_record_is_announced_by_a_reset_record(container):
    """`kb reindex`, a restored reindex backup and older callers bump with no token: the bump logs a reset
    record, under "reset" (a reader of the previous version, which reads only "revision", then still does its
    full diff instead of taking an empty document list for "nothing changed")."""
    store = container.store
    rev = store.bump_revision("notes")
    (reset,) = store.changes_since("notes", 0)
    assert (reset["reset"], reset["documents"], "revision" in reset) == (rev, [], False)
    assert store.revision("notes") == rev and announced(reset) == rev
    written = store.bump_revision("notes", store.log_change("notes", ["a.md"]))
    records = store.changes_since("notes", 0)
    assert [announced(r) for r in records] == [rev, written]  # a write's own record, no reset added
    assert records[1]["documents"] == ["a.md"] and "reset" not in records[1]
