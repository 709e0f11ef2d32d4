"""A Chroma server that is alive but slow (answers its heartbeat after several seconds) was called "unreachable
... Start it with `chroma run`": a probe that times out now says it did not answer within the connect timeout
(`chroma_connect_timeout`, RESEARCH_AGENT_CHROMA_CONNECT_TIMEOUT), while a refused connection still says how to
start the server. Real sockets: a local HTTP server that sleeps before answering, a port nobody listens on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from research_agent.config import Settings
from research_agent.errors import StoreUnavailableError
from research_agent.storage.store import Store

#: How long the slow server waits before it answers (the outside tester's proxy delayed by 7 s).
DELAY = 3.0


@contextmanager
def slow_server(delay: float) -> Iterator[int]:
    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            time.sleep(delay)
            body = b'{"nanosecond heartbeat": 1}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _connect_error(store: Store) -> StoreUnavailableError:
    with pytest.raises(StoreUnavailableError) as info:
        store.client  # noqa: B018 - connecting is the point
    return info.value


def test_a_slow_server_did_not_answer_within_the_connect_timeout(tmp_path):
    with slow_server(DELAY) as port:
        settings = Settings(store=tmp_path / "s", chroma_host="127.0.0.1", chroma_port=port, chroma_connect_timeout=1)
        started = time.monotonic()
        error = _connect_error(Store(settings))
        elapsed = time.monotonic() - started
    assert "did not answer within 1 s" in error.message and error.retryable, error.message
    guidance = str(error.data.get("guidance"))
    assert "chroma run" not in guidance and "CHROMA_CONNECT_TIMEOUT" in guidance, guidance
    assert elapsed < DELAY + 30  # bounded by the setting, not a hang


def test_a_refused_connection_still_says_start_the_server(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = _connect_error(Store(Settings(store=tmp_path / "s", chroma_host="127.0.0.1", chroma_port=port)))
    guidance = str(error.data.get("guidance"))
    assert "unreachable" in error.message and "chroma run" in guidance, (error.message, guidance)


def test_a_connect_timeout_long_enough_reaches_a_slow_server(tmp_path):
    """Raising the setting is the guidance's fix: with 3 s more than the delay the same server connects."""
    with slow_server(0.5) as port:
        store = Store(Settings(store=tmp_path / "s", chroma_host="127.0.0.1", chroma_port=port,
                               chroma_connect_timeout=DELAY + 3))
        store._probe()  # the probe is what timed out; chromadb's own client needs a real Chroma behind it


def test_the_connect_timeout_must_be_positive():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Settings(chroma_connect_timeout=0)


def test_the_connect_timeout_is_read_from_the_environment(monkeypatch):
    from research_agent.config import load_settings

    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_CONNECT_TIMEOUT", "12.5")
    assert load_settings().chroma_connect_timeout == 12.5
