"""The store's own small files: never written through a symlink, and an identity that tells a copy of the store from
a store re-created at its path (findings 1 and 3 of the seventh attack pass; storage/generation.py, locks.py).

Real embedded Chroma stores; the process that re-creates the store is a real CLI subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.container import build_container
from research_agent.errors import StoreUnavailableError
from research_agent.storage.generation import STORE_ID_FILE
from test_store_moved import CHILD_NAMES, HANG, ROOT, _names

VICTIM_TEXT = "root:x:0:0:root:/root:/bin/bash\n"
LOCK_FILES = (".read.lock", ".read.turnstile", ".write.lock")
def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "passwd"
    victim.parent.mkdir()
    victim.write_text(VICTIM_TEXT)
    return victim


def _cli(*args: str) -> subprocess.CompletedProcess:
    return _python("-m", "research_agent", *args)


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=HANG * 5)


def _generation_linked_to_a_victim(tmp_path: Path):
    """A store with a collection whose `.generation` is a symlink to a victim file outside it."""
    c = build_container()
    collections.create_collection(c, "kept")
    generation = c.settings.store / ".generation"
    victim = _victim(tmp_path)
    generation.unlink()
    generation.symlink_to(victim)
    return c, generation, victim


def _names_elsewhere() -> list[str]:
    other = _python("-c", CHILD_NAMES)
    assert other.returncode == 0, other.stderr[-2000:]
    return json.loads(other.stdout.splitlines()[-1])


def test_a_write_replaces_a_generation_symlink_and_never_writes_its_target(tmp_path):
    c, generation, victim = _generation_linked_to_a_victim(tmp_path)

    collections.create_collection(c, "after")  # wrote the victim on the old code (Path.write_text follows links)
    assert victim.read_text() == VICTIM_TEXT
    assert generation.is_file() and not generation.is_symlink()
    assert len(generation.read_text()) == 32  # a whole generation: readers never see a torn value
    assert not list(c.settings.store.glob(".generation.*.tmp"))  # no temp file left behind
    assert _names(c) == ["after", "kept"]


@pytest.mark.parametrize("name", LOCK_FILES)
def test_a_lock_file_that_is_a_dangling_symlink_creates_nothing_and_is_a_coded_error(tmp_path, name):
    c = build_container()
    collections.create_collection(c, "kept")
    lock = c.settings.store / name
    target = tmp_path / "elsewhere" / "created-by-us"
    target.parent.mkdir()
    lock.unlink(missing_ok=True)
    lock.symlink_to(target)

    with pytest.raises(StoreUnavailableError) as raised:
        if name == ".write.lock":
            collections.create_collection(c, "while-linked")
        else:
            _names(c)
    assert not target.exists()  # O_CREAT made the link's target on the old code
    assert str(lock) in raised.value.message and raised.value.code == -32001
    lock.unlink()
    assert "kept" in _names(c)  # writers re-create the file once the link is gone


def test_a_cli_write_through_a_generation_symlink_leaves_the_target_alone(tmp_path):
    c, generation, victim = _generation_linked_to_a_victim(tmp_path)

    done = _cli("collections", "create", "from-cli")
    assert done.returncode == 0, done.stderr[-2000:]
    assert victim.read_text() == VICTIM_TEXT
    assert not generation.is_symlink()
    assert _names(c) == ["from-cli", "kept"]  # this process saw the other one's commit


def test_a_store_re_created_at_the_path_by_another_process_is_refused_never_adopted(tmp_path):
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    moved = store.with_name("store.mv")
    store.rename(moved)

    made = _cli("collections", "create", "other")  # another process makes a new store at the path (a write)
    assert store.is_dir(), made.stderr[-2000:]
    with pytest.raises(StoreUnavailableError) as raised:
        _names(c)  # answered [] on the old code: the new folder was taken for a copy put back
    assert "not the one this process opened" in raised.value.message and str(store) in raised.value.message
    with pytest.raises(StoreUnavailableError):
        collections.create_collection(c, "into-the-wrong-store")
    assert _names_elsewhere() == ["other"]  # nothing was written into the new store
    assert (store / STORE_ID_FILE).read_text() != (moved / STORE_ID_FILE).read_text()

    shutil.rmtree(store)
    moved.rename(store)
    assert _names(c) == ["kept"]  # the original back: the same process reads it again


def test_an_old_store_without_an_id_gets_one_and_a_copy_of_it_is_still_reopened():
    c = build_container()
    collections.create_collection(c, "kept")
    store = c.settings.store
    (store / STORE_ID_FILE).unlink()  # a store made by a version without store ids
    c = build_container()
    assert _names(c) == ["kept"]
    store_id = (store / STORE_ID_FILE).read_text()
    assert len(store_id) == 32

    copy = store.with_name("store.copy")
    shutil.copytree(store, copy)
    store.rename(store.with_name("store.old"))
    copy.rename(store)
    collections.create_collection(c, "after")  # the copy (same id) is reopened, the write lands in it
    assert _names_elsewhere() == ["after", "kept"]
    assert (store / STORE_ID_FILE).read_text() == store_id


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_committed_write_stands_when_the_generation_cannot_be_written_and_warns_once():
    c = build_container()
    collections.create_collection(c, "kept")
    generation = c.settings.store / ".generation"
    generation.unlink()
    generation.mkdir()
    logger, seen = logging.getLogger("research_agent.storage.store"), _Records()
    logger.addHandler(seen)  # (the research_agent logger may not propagate to pytest's capture)
    try:
        collections.create_collection(c, "first")  # raised -32001 on the old code, after its commit
        collections.create_collection(c, "second")
    finally:
        logger.removeHandler(seen)
    warned = [r for r in seen.records if f"Cannot write {generation}" in r.getMessage()]  # (readers warn apart)
    assert len(warned) == 1, [r.getMessage() for r in seen.records]  # one line per distinct failure
    assert c.store.unpublished == warned[0].getMessage()
    generation.rmdir()
    collections.create_collection(c, "third")
    assert c.store.unpublished is None and generation.is_file()
    assert _names_elsewhere() == ["first", "kept", "second", "third"]


def test_a_keyword_index_lock_that_is_a_symlink_is_a_coded_error_and_creates_nothing(tmp_path):
    """The keyword index's catch-up lock (`<index>.lock` beside its folder) opens without following a link: a
    dangling symlink there neither creates its target nor gives an uncoded OSError."""
    from research_agent.search import keyword_sync

    folder = tmp_path / "keyword-index"
    folder.mkdir()
    lock = keyword_sync._file_lock(folder, (3, 2), timeout=1.0)
    target = tmp_path / "victim"
    lock.path.symlink_to(target)
    with pytest.raises(StoreUnavailableError) as err:
        with lock:
            pass
    assert str(lock.path) in str(err.value) and not target.exists()
