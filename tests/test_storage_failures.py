"""A disk that is full, a file size limit or a disk I/O error while writing the store is a coded, retryable error
that says what to do, never "Unexpected failure (InternalError)" (the seventh attack pass: `ulimit -f 1000;
research-agent kb add-folder ...` gave exit 1; a full tmpfs gave -32000 over MCP). The next write undoes what the
failed one left (tests/test_crash_harness.py covers the recovery); here: the error a user sees."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from research_agent.errors import StoreUnavailableError, as_research_agent_error

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EFBIG, "File too large"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    RuntimeError("Query error: Database error: error returned from database: (code: 778) disk I/O error"),
    RuntimeError("error returned from database: (code: 13) database or disk is full"),
], ids=["enospc", "efbig", "edquot", "sqlite-ioerr", "sqlite-full"])
def test_storage_failures_are_coded_and_say_what_to_do(exc):
    err = as_research_agent_error(exc)
    assert isinstance(err, StoreUnavailableError) and err.code == -32001 and err.exit_code == 3
    assert "disk" in err.message and "space" in err.data["guidance"]
    assert "Unexpected" not in err.message


def test_other_failures_stay_unexpected():
    assert not isinstance(as_research_agent_error(RuntimeError("boom")), StoreUnavailableError)
    assert not isinstance(as_research_agent_error(OSError(errno.ENOENT, "gone")), StoreUnavailableError)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))  # what `ulimit -f` sets: writes past it fail


@pytest.mark.slow
def test_an_ingest_past_the_file_size_limit_exits_3_with_guidance_then_a_rerun_completes(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(60):
        (docs / f"d{i}.md").write_text(f"# Doc {i}\n\n" + " ".join(f"word{j}x{i}" for j in range(400)) + "\n")
    env = {**os.environ, "RESEARCH_AGENT_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1",
           "RESEARCH_AGENT_RERANK": "false"}
    cmd = [sys.executable, "-m", "research_agent", "kb", "add-folder", str(docs), "--collection", "limited",
           "--create"]
    limited = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                             preexec_fn=_limit_file_size)
    assert limited.returncode == 3, (limited.returncode, limited.stderr[-2000:])
    assert "Unexpected failure" not in limited.stderr and "Traceback" not in limited.stderr
    assert "disk" in limited.stderr and "space" in limited.stderr
    again = subprocess.run(cmd[:-1], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    listed = subprocess.run([sys.executable, "-m", "research_agent", "kb", "list-documents", "--collection",
                             "limited", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and json.loads(listed.stdout)["total"] == 60, listed.stdout[-1500:]
