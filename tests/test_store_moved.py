"""A store folder moved away under a running process (finding 6 of the sixth attack pass).

Before: every query of a long-lived MCP server answered -32000 "Unexpected failure (FileNotFoundError)" with a
37-line traceback on stderr per query, and a writer's file lock recreated the folder (empty) at the old path.
Now: StoreUnavailableError (-32001, retryable) whose guidance names the path, nothing recreated, one log line from
the freshness watcher, and the same process reads the store again once the folder is back.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.container import build_container
from research_agent.errors import StoreUnavailableError
from research_agent.search.freshness import FreshnessWatcher
from test_mcp_stdio import _initialize, _mcp_env, _McpStdioSession

#: A bound to catch a hang, not a timing goal.
HANG = 60.0
ROOT = Path(__file__).parents[1]
CHILD_NAMES = (
    "import json\n"
    "from research_agent.catalog import collections\n"
    "from research_agent.container import build_container\n"
    "c = build_container()\n"
    "with c.store.session():\n"
    "    print(json.dumps([i.name for i in collections.list_collections(c).collections]))\n"
)


def _names(c) -> list[str]:
    with c.store.session():
        return [info.name for info in collections.list_collections(c).collections]


def _moved(store: Path) -> Path:
    moved = store.with_name(store.name + ".moved")
    store.rename(moved)
    return moved


def _assert_store_missing(error: StoreUnavailableError, store: Path) -> None:
    assert error.code == -32001 and error.data["retryable"] is True
    assert str(store) in error.message and str(store) in error.data["guidance"]


def test_reads_and_writes_of_a_moved_store_are_coded_errors_and_never_recreate_it():
    c = build_container()
    collections.create_collection(c, "kept")
    assert _names(c) == ["kept"]
    store = c.settings.store
    moved = _moved(store)

    with pytest.raises(StoreUnavailableError) as read:
        _names(c)
    _assert_store_missing(read.value, store)
    with pytest.raises(StoreUnavailableError) as write:
        collections.create_collection(c, "while-moved")
    _assert_store_missing(write.value, store)
    with pytest.raises(StoreUnavailableError):
        c.store.stale  # noqa: B018 - the freshness watcher's poll
    assert not store.exists()  # no reader or writer made an empty store at the old path

    moved.rename(store)
    assert _names(c) == ["kept"]  # the same process, no reopen needed
    collections.create_collection(c, "after")
    assert _names(c) == ["after", "kept"]



def test_a_write_whose_store_moves_right_after_the_check_does_not_recreate_it(monkeypatch):
    """The race the real server met (1 run in 6): a write (the query history's, just after an answer) checked
    that the store folder was there, then it moved, then the write lock's file was made: the lock library
    created the missing folder, the client reopened an empty store there and answered "Unknown collections"."""
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    check = type(c.store)._make_store_dir
    moved: list[Path] = []

    def check_then_move(self) -> None:  # the folder moves right after the check passed
        check(self)
        if not moved:
            moved.append(_moved(store))

    monkeypatch.setattr(type(c.store), "_make_store_dir", check_then_move)
    with pytest.raises(StoreUnavailableError) as write:
        collections.create_collection(c, "while-moved")
    _assert_store_missing(write.value, store)
    assert not store.exists()
    monkeypatch.undo()
    moved[0].rename(store)
    assert _names(c) == ["kept"]

class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_store_put_back_from_a_copy_is_reopened_so_a_write_lands_in_it():
    """The folder at the path is a copy (same generation file, another inode): the open client held the old
    folder's SQLite file, so this process's write went there and other processes never saw it."""
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    copy = store.with_name("store.copy")
    shutil.copytree(store, copy)
    _moved(store)
    copy.rename(store)

    collections.create_collection(c, "after")
    assert _names(c) == ["after", "kept"]
    other = subprocess.run([sys.executable, "-c", CHILD_NAMES], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=HANG * 5)
    assert other.returncode == 0, other.stderr[-2000:]
    assert json.loads(other.stdout.splitlines()[-1]) == ["after", "kept"]  # another process reads the same


def test_the_freshness_watcher_logs_a_moved_store_once_and_recovers():
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    watcher = FreshnessWatcher(c, poll=0.02)
    logger, seen = logging.getLogger("research_agent.search.freshness"), _Records()
    logger.addHandler(seen)  # (the research_agent logger may not propagate to pytest's capture)
    try:
        assert watcher.start()
        try:
            moved = _moved(store)
            deadline = time.monotonic() + HANG
            while watcher.error is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)  # ~25 more looks at the missing store
            assert watcher.error is not None and str(store) in watcher.error
            moved.rename(store)
            while watcher.error is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert watcher.error is None
        finally:
            watcher.stop()
    finally:
        logger.removeHandler(seen)
    said = seen.records
    assert len(said) == 1 and str(store) in said[0].getMessage() and said[0].exc_info is None
    assert not store.with_name(store.name + ".moved").exists()


def _tool(s: _McpStdioSession, request_id: int, tool: str, **arguments) -> dict:
    s.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}})
    return s.response(request_id, timeout=HANG * 3)


def _found(reply: dict) -> list[str]:
    assert "result" in reply and reply["result"]["isError"] is False, reply
    return [hit["source_document"] for hit in reply["result"]["structuredContent"]["results"]]


#: The keyword query that finds the note `_server_with_one_note` adds.
QUERY = {"query": "zebracorn router", "collections": ["kept"], "mode": "keyword", "rerank": False}


def _server_with_one_note(tmp_path: Path):
    """(env, store, session): a real stdio server whose store holds collection "kept" with one note QUERY finds."""
    env = {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"}
    s = _McpStdioSession(tmp_path / "work", env)
    try:
        _initialize(s)
        assert "result" in _tool(s, 2, "manage_collections", action="create", collection_name="kept")
        added = _tool(s, 3, "manage_documents", action="add-note", collection="kept", title="Router",
                      content="The zebracorn router switches traffic after health checks pass.")
        assert "result" in added and added["result"]["isError"] is False, added
        assert len(_found(_tool(s, 4, "query_knowledge_base", **QUERY))) == 1
    except BaseException:
        s.proc.kill()
        raise
    return env, Path(env["RESEARCH_AGENT_STORE"]), s


@pytest.mark.slow
def test_a_stdio_server_answers_a_coded_error_while_its_store_is_moved_and_answers_again_once_it_is_back(tmp_path):
    env, store, s = _server_with_one_note(tmp_path)
    query = QUERY
    try:
        moved = _moved(store)
        time.sleep(1.0)  # the freshness watcher looks 4 times a second
        for request_id in (5, 6, 7):
            reply = _tool(s, request_id, "query_knowledge_base", **query)
            error = reply.get("error")
            assert error and error["code"] == -32001, reply  # was -32000 "Unexpected failure (FileNotFoundError)"
            assert error["data"]["type"] == "StoreUnavailableError" and str(store) in error["data"]["guidance"]
        wrote = _tool(s, 8, "manage_documents", action="add-note", collection="kept", title="Lost",
                      content="Written while the store was away.")
        assert wrote.get("error", {}).get("code") == -32001, wrote
        assert not store.exists()

        moved.rename(store)
        assert len(_found(_tool(s, 9, "query_knowledge_base", **query))) == 1  # no restart
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    stderr = s.stderr()
    assert "Traceback" not in stderr, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if " WARNING " in line or " ERROR " in line]
    # The watcher's one line, not one per query; and at most one from a write (the query history's) that committed
    # as the folder moved and could not tell other processes (storage/locks.py `_publish`).
    assert len(warnings) <= 2 and len({line.split()[3] for line in warnings}) == len(warnings), warnings
    assert all(str(store) in line for line in warnings), warnings


@pytest.mark.slow
def test_a_stdio_server_refuses_a_store_another_process_re_created_at_its_path(tmp_path):
    """Finding 3 of the seventh attack pass: `mv store store.mv; research-agent status` made an empty store at the
    path and the server adopted it (a new inode looked like a copy put back): "Collection not found"."""
    env, store, s = _server_with_one_note(tmp_path)
    query = QUERY
    try:
        moved = _moved(store)
        made = subprocess.run([sys.executable, "-m", "research_agent", "collections", "create", "other"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=HANG * 5)
        assert store.is_dir(), made.stderr[-2000:]  # the CLI made a new store at the path (reads no longer do)
        for request_id in (5, 6):
            reply = _tool(s, request_id, "query_knowledge_base", **query)
            error = reply.get("error")
            assert error and error["code"] == -32001, reply  # "Collection not found" from the empty store before
            assert "not the one this process opened" in error["message"] and str(store) in error["message"]
        wrote = _tool(s, 7, "manage_collections", action="create", collection_name="into-the-new-one")
        assert wrote.get("error", {}).get("code") == -32001, wrote

        shutil.rmtree(store)
        moved.rename(store)
        assert len(_found(_tool(s, 8, "query_knowledge_base", **query))) == 1  # the original again, no restart
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    stderr = s.stderr()
    assert "Traceback" not in stderr, stderr[-3000:]
