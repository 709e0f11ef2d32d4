"""A writer that fails part-way never keeps the read gate or its file locks (storage/locks.py).

Finding 4 of the sixth attack pass: a commit's `<store>/.generation` write raised (there: `.generation` replaced by a
directory) before the gate opened, and the writing process kept `.read.lock` and `.read.turnstile` locked until it
exited: every other process's reads and writes timed out. These tests use a real embedded Chroma store and real
flocks; where another process is the point, it is a real subprocess.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.container import build_container
from research_agent.errors import ConfigError
from research_agent.storage import lock_primitives
from research_agent.storage.lock_primitives import ReadGate

ROOT = Path(__file__).parents[1]
#: Other processes wait this long for the gate (RESEARCH_AGENT_LOCK_TIMEOUT): a gate left closed shows up as a
#: StoreUnavailableError after it, an open one answers at once.
LOCK_TIMEOUT = "3"
#: A bound to catch a hang, not a timing goal.
HANG = 60.0

# Process A: one write whose generation write fails, then it stays alive as a long-lived server would.
CHILD_WRITER = (
    "import sys\n"
    "from research_agent.catalog import collections\n"
    "from research_agent.container import build_container\n"
    "from research_agent.errors import ResearchAgentError\n"
    "c = build_container()\n"
    "try:\n"
    "    collections.create_collection(c, 'from-a')\n"
    "    print('ok', flush=True)\n"
    "except ResearchAgentError as exc:\n"
    "    print('coded', exc.code, exc.data['type'], flush=True)\n"
    "except Exception as exc:\n"
    "    print('raw', type(exc).__name__, flush=True)\n"
    "sys.stdin.readline()\n"
)


def _container(monkeypatch):
    monkeypatch.setenv("RESEARCH_AGENT_LOCK_TIMEOUT", LOCK_TIMEOUT)
    return build_container()


def _names(c) -> list[str]:
    with c.store.session():  # a read as the CLI and the server do it: through the read gate
        return [info.name for info in collections.list_collections(c).collections]


def _generation_as_folder(c) -> Path:
    path = c.settings.store / ".generation"
    path.unlink(missing_ok=True)
    path.mkdir()
    return path


def test_a_process_whose_generation_write_fails_leaves_other_processes_free_to_read_and_write(monkeypatch):
    c = _container(monkeypatch)
    collections.create_collection(c, "shared")
    generation = _generation_as_folder(c)
    child = subprocess.Popen([sys.executable, "-c", CHILD_WRITER], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        line = child.stdout.readline().strip()  # process A is alive from here on, its write done
        started = time.monotonic()
        assert {"shared", "from-a"} <= set(_names(c))  # timed out after 3 s on the old code; A's write committed
        generation.rmdir()
        collections.create_collection(c, "from-b")
        assert time.monotonic() - started < HANG
        assert (c.settings.store / ".generation").is_file()
        assert line == "ok", line  # A's write committed and stands (it answered -32001 before: finding 4, 7th pass)
    finally:
        child.stdin.close()
        child.wait(timeout=HANG)


def test_a_failing_generation_write_while_readers_are_admitted_leaves_the_client_usable(monkeypatch):
    """`admit_readers` (a reindex filling its copy) downgrades the writer's use to shared, then publishes a
    generation: when that raised, the end of the write released the use as if it were still exclusive and the
    next write of this process waited for ever."""
    c = _container(monkeypatch)
    collections.create_collection(c, "shared")
    store = c.store
    generation = _generation_as_folder(c)
    outcome: list[object] = []

    def writes() -> None:
        try:
            with store.write_lock():
                store.admit_readers()
        except Exception as exc:  # noqa: BLE001 - the test checks which
            outcome.append(exc)
        outcome.append(store.unpublished)
        generation.rmdir()
        with store.write_lock():
            pass
        outcome.append("second write done")

    thread = threading.Thread(target=writes, daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), "the second write hung"
    assert len(outcome) == 2 and outcome[1] == "second write done", outcome
    assert str(generation) in outcome[0]  # the failure to publish is a warning, not the write's error
    assert store.unpublished is None  # the second write published
    assert _names(c) == ["shared"]  # the gate is open for this process's readers too


def test_a_writer_that_cannot_open_the_read_lock_file_does_not_keep_the_turnstile(monkeypatch):
    """The writer takes `.read.turnstile` first, then `.read.lock`: when the second could not be opened the
    first stayed locked and every reader (any process) waited for ever."""
    c = _container(monkeypatch)
    collections.create_collection(c, "shared")
    read_lock = c.settings.store / ".read.lock"
    read_lock.unlink(missing_ok=True)
    read_lock.mkdir()
    with pytest.raises(Exception) as raised:
        with c.store.write_lock():
            pass
    read_lock.rmdir()
    other = ReadGate(c.settings.store)  # its own descriptors: flocks conflict as between processes
    assert other.enter(1.0) is True  # False on the old code: the turnstile stayed locked
    other.leave()
    assert _names(c) == ["shared"]
    assert isinstance(raised.value, ConfigError), raised.value  # a coded error, not IsADirectoryError
    assert str(c.settings.store) in raised.value.message


def test_a_lock_failure_other_than_busy_closes_the_descriptor(tmp_path, monkeypatch):
    """Pure logic (the failure is injected): an flock that fails with an error other than "busy" (ENOLCK)
    closes its descriptor; the old loop kept one open per failed read."""
    import fcntl

    real_flock = fcntl.flock
    readers_path = str(tmp_path / ".read.lock")

    def flock(fd: int, op: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == readers_path:
            raise OSError(errno.ENOLCK, "No locks available")
        real_flock(fd, op)

    gate = ReadGate(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(fcntl, "flock", flock)
    for _ in range(3):
        with pytest.raises(OSError):
            gate.enter(1.0)
        with pytest.raises(OSError):
            gate.close(1.0)
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert len(os.listdir("/proc/self/fd")) == before
    assert gate.close(1.0) is True  # nothing of the failed attempts holds a lock
    gate.open()
    fd = lock_primitives.flock(Path(readers_path), True, time.monotonic() + 1.0)
    assert fd is not None
    os.close(fd)


def test_a_write_that_fails_keeps_its_own_error_when_the_generation_write_fails_too(monkeypatch):
    c = _container(monkeypatch)
    collections.create_collection(c, "shared")
    generation = _generation_as_folder(c)
    with pytest.raises(ValueError, match="the write's own failure"):  # not IsADirectoryError from the cleanup
        with c.store.write_lock():
            raise ValueError("the write's own failure")
    other = ReadGate(c.settings.store)
    assert other.enter(1.0) is True  # the gate opened all the same
    other.leave()
    generation.rmdir()
    assert _names(c) == ["shared"]
