"""The store's small files and a store path with nothing there (findings 1-3 of the eighth attack pass).

1. A directory at a lock file is a coded error naming the file and saying to remove it; a `.generation` or
   `.store-id` that cannot be read is one warning naming it (storage/store.py `store_error`, generation.py).
2. An emptied or garbled `.store-id` is no id: it is written again (one warning), the id a process holds is never
   dropped, and a folder put in the store's place without a readable id is refused, naming the id to write back.
3. Read-only commands never create the store folder (nor its parents): they answer as for an empty store, and
   `status` says where the first write will create it; writes create it as before.

Real embedded Chroma stores; the other processes are real CLI subprocesses.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.container import build_container
from research_agent.errors import ConfigError, StoreUnavailableError
from research_agent.storage.generation import STORE_ID_FILE
from test_cli import cli, cli_error, cli_json
from test_store_files import LOCK_FILES, _cli, _names_elsewhere
from test_store_moved import _names


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings():
    logger, seen = logging.getLogger("research_agent.storage.store"), _Warnings()
    logger.addHandler(seen)  # (the research_agent logger may not propagate to pytest's capture)
    yield seen.messages
    logger.removeHandler(seen)


def _store_with(name: str = "kept"):
    c = build_container()
    collections.create_collection(c, name)
    return c, c.settings.store


# -- 1. lock files, `.generation` and `.store-id` that are not files -----------------------------------------------
@pytest.mark.parametrize("name", LOCK_FILES)
def test_a_directory_at_a_lock_file_is_a_coded_error_naming_it_and_saying_to_remove_it(name):
    _, store = _store_with()
    lock = store / name
    lock.unlink(missing_ok=True)
    lock.mkdir()
    c = build_container()

    with pytest.raises(ConfigError) as raised:
        if name == ".write.lock":
            collections.create_collection(c, "while-a-folder")
        else:
            _names(c)
    error = raised.value
    assert error.code == -32001 and error.exit_code == 3
    assert str(lock) in error.message  # "Cannot open the store at <store>: Is a directory" on the old code
    assert "Remove" in error.data["guidance"] and str(lock) in error.data["guidance"]
    lock.rmdir()
    collections.create_collection(c, "after")
    assert _names(c) == ["after", "kept"]


def test_the_cli_names_a_read_lock_that_is_a_directory_exit_3():
    _, store = _store_with()
    lock = store / ".read.lock"
    lock.unlink()
    lock.mkdir()
    error = cli_error(3, "collections", "list")
    assert error["code"] == -32001 and str(lock) in error["message"], error
    assert "Traceback" not in json.dumps(error)


def test_a_generation_that_is_a_directory_is_one_warning_for_a_reader(warnings):
    _, store = _store_with()
    generation = store / ".generation"
    generation.unlink()
    generation.mkdir()
    c = build_container()
    for _ in range(3):
        assert _names(c) == ["kept"]
    said = [m for m in warnings if str(generation) in m]
    assert len(said) == 1 and "remove it" in said[0], warnings  # silent on the old code: stale reads, no word


def test_a_store_id_that_is_a_directory_is_one_warning_naming_it_and_reads_go_on(warnings):
    _, store = _store_with()
    store_id = store / STORE_ID_FILE
    store_id.unlink()
    store_id.mkdir()
    c = build_container()
    assert _names(c) == ["kept"]
    collections.create_collection(c, "after")
    said = [m for m in warnings if str(store_id) in m]
    assert len(said) == 1 and "remove it" in said[0], warnings  # a debug line only on the old code
    store_id.rmdir()
    c = build_container()
    assert _names(c) == ["after", "kept"] and len(store_id.read_text()) == 32


# -- 2. an emptied or garbled `.store-id` ------------------------------------------------------------------------
def _copy_put_back(store: Path) -> None:
    copy = store.with_name("store.copy")
    shutil.copytree(store, copy)
    store.rename(store.with_name("store.old"))
    copy.rename(store)


def test_an_emptied_store_id_is_written_again_and_a_copy_put_back_is_still_reopened(warnings):
    c, store = _store_with()
    (store / STORE_ID_FILE).write_bytes(b"")  # emptied (a crash, a tool, a hand)
    done = _cli("collections", "create", "other")  # another process opens it first: it writes an id
    assert done.returncode == 0, done.stderr[-2000:]
    assert _names(c) == ["kept", "other"]  # this process reopens: its id was dropped to None here on the old code
    store_id = (store / STORE_ID_FILE).read_text()
    assert len(store_id) == 32 and int(store_id, 16) >= 0

    _copy_put_back(store)
    collections.create_collection(c, "after")  # refused on the old code: "not the one this process opened"
    assert _names_elsewhere() == ["after", "kept", "other"]
    assert (store / STORE_ID_FILE).read_text() == store_id


def test_a_garbled_store_id_is_replaced_with_a_new_id_and_one_warning(warnings):
    _, store = _store_with()
    path = store / STORE_ID_FILE
    path.write_text("not an id\n")
    c = build_container()
    assert _names(c) == ["kept"]
    new_id = path.read_text()
    assert len(new_id) == 32 and int(new_id, 16) >= 0  # the garbage was taken for the id on the old code
    assert [m for m in warnings if str(path) in m and "garbled" in m], warnings
    warnings.clear()
    assert _names(build_container()) == ["kept"] and not warnings  # repaired once
    assert path.read_text() == new_id


def test_a_copy_whose_store_id_was_emptied_is_refused_naming_the_id_to_write_back():
    c, store = _store_with()
    path = store / STORE_ID_FILE
    held = path.read_text()
    path.write_bytes(b"")
    _copy_put_back(store)  # the copy's id is empty: it cannot be told from a store re-created at the path

    with pytest.raises(StoreUnavailableError) as raised:
        _names(c)
    assert str(path) in raised.value.message and held in raised.value.data["guidance"]
    path.write_text(held)  # what the guidance says
    assert _names(c) == ["kept"]
    collections.create_collection(c, "after")
    assert _names_elsewhere() == ["after", "kept"]


def test_a_store_re_created_at_the_path_with_its_id_emptied_is_still_refused():
    c, store = _store_with()
    store.rename(store.with_name("store.mv"))
    done = _cli("collections", "create", "new-store")  # a write: it creates a new store at the path
    assert done.returncode == 0, done.stderr[-2000:]
    (store / STORE_ID_FILE).write_bytes(b"")
    for _ in range(2):
        with pytest.raises(StoreUnavailableError) as raised:
            _names(c)
        assert "not the one this process opened" in raised.value.message
    assert _names_elsewhere() == ["new-store"]


# -- 3. a store path with nothing there ---------------------------------------------------------------------------
READ_ONLY_COMMANDS = (("status",), ("collections", "list"), ("projects", "list"), ("doctor",),
                      ("query", "anything"), ("kb", "list-documents", "--collection", "kept"))


def test_read_only_cli_commands_create_no_store_folder_nor_its_parents(tmp_path):
    store = tmp_path / "not" / "yet" / "store"
    for command in READ_ONLY_COMMANDS:
        result = cli("--store", str(store), *command)
        assert result.exit_code in (0, 4, 6), (command, result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "not").exists(), command  # every command made the store on the old code
    status = cli("--store", str(store), "status")
    assert "does not exist yet" in status.stderr and str(store) in status.stderr
    assert cli_json("--store", str(store), "status")["collections"] == 0
    assert cli_json("--store", str(store), "collections", "list")["collections"] == []

    made = cli("--store", str(store), "collections", "create", "first")  # a write creates it, as before
    assert made.exit_code == 0, made.stderr
    assert cli_json("--store", str(store), "collections", "list")["collections"][0]["name"] == "first"
    assert "does not exist yet" not in cli("--store", str(store), "status").stderr


def test_a_store_path_under_a_file_is_still_a_coded_error_for_a_read(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    error = cli_error(3, "--store", str(tmp_path / "file" / "store"), "collections", "list")
    assert error["type"] == "ConfigError" and "Cannot open the store" in error["message"]  # not "no collections"


def test_status_on_a_moved_store_leaves_the_path_free_for_moving_it_back():
    c, store = _store_with()
    moved = store.with_name("store.mv")
    store.rename(moved)
    status = _cli("status")
    assert status.returncode == 0, status.stderr[-2000:]
    assert not store.exists()  # an empty store here made `mv store.mv store` nest the real one inside it
    moved.rename(store)
    assert _names_elsewhere() == ["kept"]
    assert _names(c) == ["kept"]


def test_a_process_that_read_before_the_store_existed_reads_and_writes_the_store_created_later():
    c = build_container()
    store = c.settings.store
    assert _names(c) == [] and not store.exists()
    with c.store.session():
        assert c.store.registry_find("document") == {}
    done = _cli("collections", "create", "from-elsewhere")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _names(c) == ["from-elsewhere"]  # the store another process created is opened, not an empty stand-in
    collections.create_collection(c, "from-here")
    assert _names_elsewhere() == ["from-elsewhere", "from-here"]  # the write reached the disk


def test_a_first_write_of_a_process_that_read_a_missing_store_lands_on_disk():
    c = build_container()
    assert _names(c) == []
    collections.create_collection(c, "first")
    assert c.settings.store.is_dir()
    assert _names_elsewhere() == ["first"]
    assert _names(c) == ["first"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_an_mcp_server_reads_a_missing_store_as_empty_and_its_first_write_creates_it(monkeypatch):
    from fastmcp import Client

    import mcp_server
    from test_mcp import call

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    store = Path(build_container().settings.store)
    async with Client(mcp_server.mcp) as client:
        assert (await call(client, "manage_collections", action="list"))["collections"] == []
        status = await call(client, "get_status")
        assert status["collections"] == 0 and status["store_reachable"] is True
        assert (await call(client, "check_store"))["healthy"] is True
        assert not store.exists()  # made by the first read on the old code
        await call(client, "manage_collections", action="create", collection_name="first")
        assert store.is_dir()
        listed = await call(client, "manage_collections", action="list")
        assert [c["name"] for c in listed["collections"]] == ["first"]
    assert _names_elsewhere() == ["first"]


@pytest.mark.anyio
async def test_a_query_on_a_missing_store_records_no_history_and_creates_nothing(monkeypatch):
    """A query is a read: on a missing store it must not create the store through its history entry (a registry
    write under the write lock, off the response path). A guard: an empty store answers "no collections" first."""
    from fastmcp import Client
    from fastmcp.exceptions import ToolError
    from mcp.shared.exceptions import MCPError

    import mcp_server

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    store = Path(build_container().settings.store)
    async with Client(mcp_server.mcp) as client:
        for mode in ("keyword", "hybrid"):
            try:
                await client.call_tool("query_knowledge_base", {"query": "retry policy", "mode": mode})
            except (MCPError, ToolError):
                pass  # an empty store may answer with a coded error; either way it is a read
    # the client's exit closes the server, which waits for the history writes
    assert not store.exists()
