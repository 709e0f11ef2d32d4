"""A write that changes nothing creates nothing; a folder holding no store reads as no store (H2b, the attack pass on
"a read never creates the store").

F1. A write whose target does not exist (delete a collection, link/unlink/set-defaults of a project) answers not
    found without creating a missing store: its folder at the path made `mv store.mv store` nest the real store.
F2. A read of an existing folder holding no store (no chroma.sqlite3, no .store-id: `--store ~/project`, `--store ''`)
    writes nothing into it; a write then makes the store there, and a process that read first then opens it.
F4. A store on a read-only file system: "Cannot open the store at X: read-only file system" (not "make the lock file
    writable", which is impossible there).
F5. `--store` a dangling symlink or a regular file: the cause named, not "File exists".
F6. `status -q` prints no note; the freshness watcher names a `.generation` that is a directory; a FIFO at
    `.store-id` is "not a regular file", not "empty".

Real embedded Chroma stores, the real CLI (in-process runner) and a real MCP client (in-process server).
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.container import build_container
from research_agent.errors import ConfigError
from research_agent.storage.generation import STORE_ID_FILE
from test_cli import cli, cli_error, cli_json
from test_store_files import _cli, _names_elsewhere
from test_store_moved import _names
from test_store_small_files import warnings  # noqa: F401 - a fixture

# -- F1: a failed write creates no store -------------------------------------------------------------------------
FAILING_WRITES = (
    ("collections", "delete", "typo", "--yes"),
    ("projects", "delete", "typo", "--yes"),
    ("projects", "link", "typo", "--collections", "abc"),
    ("projects", "unlink", "typo", "--collections", "abc"),
    ("projects", "set-defaults", "typo", "--collections", "abc"),
)


@pytest.mark.parametrize("command", FAILING_WRITES, ids=lambda c: " ".join(c[:2]))
def test_a_cli_write_whose_target_is_missing_creates_no_store(tmp_path, command):
    store = tmp_path / "gone" / "store"
    error = cli_error(4, "--store", str(store), *command)
    assert error["type"] == "CollectionError" and "not found" in error["message"], error
    assert not (tmp_path / "gone").exists(), command  # the store folder was made by the write lock on the old code


def test_a_failed_write_on_a_moved_store_leaves_the_path_free_to_move_it_back(tmp_path):
    store = tmp_path / "store"
    assert cli("--store", str(store), "collections", "create", "keepme").exit_code == 0
    store.rename(tmp_path / "store.mv")
    cli_error(4, "--store", str(store), "collections", "delete", "typo", "--yes")
    assert not store.exists()
    (tmp_path / "store.mv").rename(store)  # nested inside an empty store on the old code
    names = [c["name"] for c in cli_json("--store", str(store), "collections", "list")["collections"]]
    assert names == ["keepme"]


def test_a_failed_write_on_an_existing_store_still_answers_not_found(tmp_path):
    store = tmp_path / "store"
    assert cli("--store", str(store), "collections", "create", "kept").exit_code == 0
    assert cli("--store", str(store), "projects", "create", "proj").exit_code == 0
    cli_error(4, "--store", str(store), "projects", "link", "proj", "--collections", "typo")
    cli_error(4, "--store", str(store), "projects", "unlink", "proj", "--collections", "kept")
    cli_error(4, "--store", str(store), "collections", "delete", "typo", "--yes")
    linked = cli_json("--store", str(store), "projects", "link", "proj", "--collections", "kept")
    assert linked["collections"] == ["kept"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_writes_whose_target_is_missing_create_no_store(monkeypatch):
    from fastmcp import Client

    import mcp_server
    from test_mcp import call_error

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    store = Path(build_container().settings.store)
    async with Client(mcp_server.mcp) as client:
        for tool, arguments in (("manage_collections", {"action": "delete", "collection_name": "typo"}),
                                ("manage_projects", {"action": "link", "project_name": "typo", "collections": "abc"}),
                                ("manage_projects", {"action": "unlink", "project_name": "typo", "collections": "abc"}),
                                ("manage_projects", {"action": "set-defaults", "project_name": "typo",
                                                     "collections": "abc"}),
                                ("manage_projects", {"action": "delete", "project_name": "typo"})):
            error = await call_error(client, tool, **arguments)
            assert error.error.code == -32002 and "not found" in error.error.message, (tool, arguments)
            assert not store.exists(), (tool, arguments)  # created by delete, link, set-defaults on the old code


# -- F2: a folder holding no store ---------------------------------------------------------------------------------
def _a_project_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "myproject"
    folder.mkdir()
    (folder / "notes.txt").write_text("notes")
    return folder


READS = (("status",), ("collections", "list"), ("projects", "list"), ("query", "anything"), ("doctor",))


def test_reads_of_a_folder_holding_no_store_write_nothing_into_it(tmp_path):
    folder = _a_project_folder(tmp_path)
    for command in READS:
        result = cli("--store", str(folder), *command)
        assert result.exit_code in (0, 4, 6), (command, result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert sorted(os.listdir(folder)) == ["notes.txt"], command  # chroma.sqlite3, .store-id, locks: old code
    assert cli_json("--store", str(folder), "status")["store_exists"] is False
    assert cli_json("--store", str(folder), "collections", "list")["collections"] == []
    note = cli("--store", str(folder), "status").stderr
    assert str(folder) in note and "no store" in note

    assert cli("--store", str(folder), "collections", "create", "first").exit_code == 0  # a write makes it there
    assert "notes.txt" in os.listdir(folder) and (folder / STORE_ID_FILE).is_file()
    assert [c["name"] for c in cli_json("--store", str(folder), "collections", "list")["collections"]] == ["first"]
    assert cli_json("--store", str(folder), "status")["store_exists"] is True


def test_a_read_with_an_empty_store_path_writes_nothing_into_the_working_folder(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for command in (("status",), ("collections", "list")):
        result = cli("--store", "", *command)
        assert "Traceback" not in result.stderr, result.stderr
        assert os.listdir(cwd) == [], command


def test_a_process_that_read_an_empty_folder_opens_the_store_another_process_makes_there(tmp_path):
    folder = _a_project_folder(tmp_path)
    c = build_container(store=str(folder))
    assert _names(c) == []
    with c.store.session():
        assert c.store.registry_find("document") == {}
    done = _cli("--store", str(folder), "collections", "create", "from-elsewhere")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _names(c) == ["from-elsewhere"]
    collections.create_collection(c, "from-here")
    assert _names(c) == ["from-elsewhere", "from-here"]


def test_a_first_write_into_an_empty_existing_folder_makes_the_store_there(tmp_path, monkeypatch):
    folder = tmp_path / "empty"
    folder.mkdir()
    monkeypatch.setenv("RESEARCH_AGENT_STORE", str(folder))
    c = build_container()
    assert _names(c) == [] and os.listdir(folder) == []
    collections.create_collection(c, "first")
    assert _names_elsewhere() == ["first"]


# -- F4: read-only file system -------------------------------------------------------------------------------------
def test_an_erofs_on_a_lock_file_says_the_store_is_on_a_read_only_file_system():
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    for name in (".read.turnstile", ".read.lock", ".write.lock"):
        error = c.store.store_error(OSError(errno.EROFS, os.strerror(errno.EROFS), str(store / name)))
        assert isinstance(error, ConfigError) and error.code == -32001
        assert error.message == f"Cannot open the store at {store}: read-only file system", error.message
        assert error.data["guidance"] == "Pass a writable --store PATH."


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_store_on_a_read_only_file_system_is_named_so_for_a_read(tmp_path):
    made = tmp_path / "made"
    assert cli("--store", str(made), "collections", "create", "kept").exit_code == 0
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        subprocess.run(["cp", "-a", str(made), str(mount / "store")], check=True)
        for name in (".read.lock", ".read.turnstile"):
            (mount / "store" / name).unlink(missing_ok=True)  # a lock file that does not exist either
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        error = cli_error(3, "--store", str(mount / "store"), "collections", "list")
        assert "read-only file system" in error["message"] and "lock file" not in error["message"], error
        assert error["data"]["guidance"] == "Pass a writable --store PATH."
    finally:
        subprocess.run(["umount", str(mount)])


# -- F5: a store path that is a link to nothing or a file ------------------------------------------------------------
@pytest.mark.parametrize("command", (("collections", "list"), ("collections", "create", "xyz")))
def test_a_store_path_that_is_a_dangling_symlink_is_named_so(tmp_path, command):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    error = cli_error(3, "--store", str(link), *command)
    assert error["message"] == (f"Cannot open the store at {link}: it is a symbolic link to a missing "
                                f"{tmp_path / 'missing'}"), error
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", (("collections", "list"), ("collections", "create", "xyz")))
def test_a_store_path_that_is_a_file_is_named_so(tmp_path, command):
    path = tmp_path / "file"
    path.write_text("not a store")
    error = cli_error(3, "--store", str(path), *command)
    assert error["message"] == f"Cannot open the store at {path}: it is a file, not a folder", error
    assert path.read_text() == "not a store"


# -- F6 --------------------------------------------------------------------------------------------------------------
def test_status_quiet_prints_no_note_about_a_missing_store(tmp_path):
    store = tmp_path / "nothing"
    assert "does not exist yet" in cli("--store", str(store), "status").stderr
    quiet = cli("--store", str(store), "-q", "status")
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr


def test_the_freshness_watcher_names_a_generation_that_is_a_directory(caplog):
    from research_agent.search.freshness import FreshnessWatcher

    c = build_container()
    collections.create_collection(c, "kept")
    assert _names(c) == ["kept"]
    generation = c.settings.store / ".generation"
    generation.unlink(missing_ok=True)
    generation.mkdir()
    watcher = FreshnessWatcher(c, poll=0.05)
    with caplog.at_level(logging.INFO, logger="research_agent"):
        watcher.start()
        try:
            import time

            deadline = time.monotonic() + 10
            while watcher.error is None and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            watcher.stop()
    assert watcher.error is not None and str(generation) in watcher.error, watcher.error  # "[Errno 21] ..." before


def test_a_fifo_at_the_store_id_is_not_a_regular_file_not_empty(warnings):  # noqa: F811
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    (store / STORE_ID_FILE).unlink()
    os.mkfifo(store / STORE_ID_FILE)
    fresh = build_container()
    assert _names(fresh) == ["kept"]
    said = [m for m in warnings if STORE_ID_FILE in m]
    assert said and "not a regular file" in said[0] and "empty" not in said[0], warnings
