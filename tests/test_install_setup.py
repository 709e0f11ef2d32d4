"""scripts/setup.sh picks the PyTorch CPU index when it answers and pip's configured index otherwise, quickly,
saying which on stderr. Driven through the script's own function against local endpoints: nothing downloads."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"


def _choose(index: str | None, timeout: float = 1.0) -> tuple[subprocess.CompletedProcess, float]:
    """Source setup.sh (which runs nothing when sourced) and call torch_index_args with the test's index."""
    env = {"PATH": "/usr/bin:/bin", "SETUP_TORCH_PROBE_TIMEOUT": str(timeout)}
    if index is not None:
        env["SETUP_TORCH_INDEX"] = index
    script = f'source "{SETUP}"; torch_index_args "{ROOT / ".venv" / "bin" / "python"}"'
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Index(http.server.BaseHTTPRequestHandler):
    """A PEP 503 page for torch, as download.pytorch.org/whl/cpu/torch/ serves it."""

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if self.path.rstrip("/") != "/whl/cpu/torch":
            self.send_error(404)
            return
        body = b'<html><body><a href="torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl">torch</a></body></html>'
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def local_index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def test_a_reachable_cpu_index_is_used_and_named(local_index):
    done, _ = _choose(local_index)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["--index-url", local_index]
    assert f"using the CPU index {local_index}" in done.stderr


def test_a_refused_cpu_index_falls_back_to_the_configured_index_and_says_so():
    index = f"http://127.0.0.1:{_free_port()}/whl/cpu"
    done, _ = _choose(index)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""  # no --index-url: pip's own configuration (here the local wheel folder)
    assert "falling back to pip's configured index" in done.stderr and index in done.stderr


def test_a_silent_cpu_index_falls_back_after_the_probe_timeout_not_pips():
    """A host that accepts the connection and never answers (a firewall that drops replies) is what made pip
    wait PIP_DEFAULT_TIMEOUT per retry; the probe gives up after SETUP_TORCH_PROBE_TIMEOUT seconds."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing is ever sent back
        index = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu"
        done, elapsed = _choose(index, timeout=1.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
    assert "no answer within 1.0s" in done.stderr
    assert elapsed < 30, f"the fallback took {elapsed:.1f} s"  # a bound to catch a hang; the probe gives up at 1 s


def test_a_page_without_torch_is_not_taken_for_the_cpu_index(local_index):
    done, _ = _choose(local_index.replace("/whl/cpu", "/elsewhere"))
    assert done.stdout.strip() == ""
    assert "falling back" in done.stderr


def test_an_empty_setting_skips_the_cpu_index():
    done, _ = _choose("")
    assert done.returncode == 0 and done.stdout.strip() == ""
    assert "SETUP_TORCH_INDEX is empty" in done.stderr


def test_sourcing_the_script_runs_nothing(tmp_path):
    """Tests and users can source it for its functions; only running it sets up .venv."""
    done = subprocess.run(["bash", "-c", f'source "{SETUP}"; type main torch_index_args >/dev/null; echo ok'],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert not (tmp_path / ".venv").exists()
