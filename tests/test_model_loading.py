"""Models load when they can and fail fast when they cannot, without touching process-wide hub settings.

The CLI runs in real subprocesses WITHOUT HF_HUB_OFFLINE (the conftest sets it for in-process tests): a
local server speaking the hub's file API (`HF_ENDPOINT`) serves a tiny cross-encoder under the default
reranker's name, a silent socket plays a network that never answers, and a private HF_HOME is the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
DEFAULT_RERANKER = "cross-encoder/ms-marco-MiniLM-L6-v2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CLI = str(Path(sys.executable).parent / "research-agent")


class FakeHub:
    """Serves one model folder as hub repo `repo`: what huggingface_hub asks for when it downloads a model
    (`/api/models/{repo}[/revision|/tree/...]`, HEAD and GET `/{repo}/resolve/{rev}/{file}` with X-Repo-Commit,
    ETag and Content-Length), and records every request. With `hold`, a file's GET waits until it is set: a
    download that takes as long as the test wants."""

    def __init__(self, repo: str, folder: Path, hold: threading.Event | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        files = {p.name: p for p in folder.iterdir() if p.is_file()}
        etags = {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(code)
                for key, value in {"X-Repo-Commit": COMMIT, "Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _answer(self) -> None:
                hub.requests.append((self.command, self.path))
                path = self.path.split("?")[0]
                if path.startswith(f"/api/models/{repo}/tree/"):
                    listing = [{"type": "file", "path": n, "size": files[n].stat().st_size, "oid": etags[n]}
                               for n in files] if path.rstrip("/").endswith(("/main", COMMIT)) else []
                    return self._send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"})
                if path.startswith(f"/api/models/{repo}"):
                    info = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                            "siblings": [{"rfilename": n} for n in files]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                found = re.fullmatch(rf"/{re.escape(repo)}/resolve/[^/]+/(.+)", path)
                if not found:
                    return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"})
                if found.group(1) not in files:
                    return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"})
                name = found.group(1)
                if hold is not None and self.command == "GET":
                    hold.wait(300)
                return self._send(200, files[name].read_bytes(), {"ETag": f'"{etags[name]}"'})

            do_GET = do_HEAD = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def silent_endpoint():
    """An address that accepts connections and never answers: a network where requests hang."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory) -> Path:
    """A store holding the fixture docs, ingested once by the real CLI (packaged embedding model)."""
    base = tmp_path_factory.mktemp("corpus")
    shutil.copytree(FIXTURES / "docs", base / "docs")
    env = _env(base, endpoint="http://127.0.0.1:9")  # nothing listens on port 9: no hub for ingestion
    for args in (["collections", "create", "docs", "--type", "fundamental"],
                 ["kb", "add-folder", str(base / "docs"), "--collection", "docs"]):
        proc = subprocess.run([CLI, "--json", *args], env=env, cwd=base, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return base / "store"


def _env(base: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """A user's environment: no HF_HUB_OFFLINE, a private hub cache, the given hub endpoint."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESEARCH_AGENT_", "HF_", "TRANSFORMERS_OFFLINE"))}
    env.update(RESEARCH_AGENT_STORE=str(base / "store"), HF_HOME=str(base / "hf"), HF_ENDPOINT=endpoint,
               XDG_CONFIG_HOME=str(base / "config"), XDG_DATA_HOME=str(base / "data"),
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT), **extra)
    return env


def _query(tmp_path: Path, store: Path, endpoint: str, mode: str = "hybrid", **extra: str) -> dict:
    env = _env(tmp_path, endpoint, **extra)
    env["RESEARCH_AGENT_STORE"] = str(store)
    proc = subprocess.run([CLI, "--json", "query", "install on linux", "--collections", "docs", "--mode", mode,
                           "--top-k", "3"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    out["stderr"] = proc.stderr
    return out


@pytest.mark.slow
def test_default_reranker_downloads_from_the_hub_then_loads_from_the_cache(tmp_path, corpus_store,
                                                                          tiny_cross_encoder):
    """The default reranker name, no HF_HUB_OFFLINE: first query downloads it, the next needs no hub."""
    hub = FakeHub(DEFAULT_RERANKER, tiny_cross_encoder)
    try:
        first = _query(tmp_path, corpus_store, hub.url)
    finally:
        hub.stop()
    assert first["reranked"] is True and not first["warnings"], first["warnings"]
    assert any(path.endswith("/model.safetensors") for method, path in hub.requests if method == "GET")
    assert all(DEFAULT_RERANKER in path for _, path in hub.requests)  # the embedding model never asks the hub
    second = _query(tmp_path, corpus_store, hub.url)  # the server is gone: the cached copy loads
    assert second["reranked"] is True and not second["warnings"], second["warnings"]
    assert all(0.0 <= hit["relevance_score"] <= 1.0 for hit in second["results"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["keyword", "semantic", "hybrid"])
def test_unreachable_hub_answers_unreranked_naming_the_cause(tmp_path, corpus_store, silent_endpoint, mode):
    """A hub that never answers costs one short probe, not the hub client's minute of retries."""
    res = _query(tmp_path, corpus_store, silent_endpoint, mode=mode)
    assert res["reranked"] is False and res["results"]
    assert f"cannot reach the Hugging Face hub at {silent_endpoint}" in res["warnings"][0], res["warnings"]
    assert "HF_HUB_OFFLINE" not in res["warnings"][0]
    assert res["timings_ms"]["rerank"] < 30_000  # a bound that catches a hang, not a timing goal
    assert "huggingface_hub" not in res["stderr"]  # no retry warnings from the hub client


def test_offline_environment_is_named_as_the_cause(tmp_path, corpus_store, silent_endpoint):
    res = _query(tmp_path, corpus_store, silent_endpoint, mode="keyword", HF_HUB_OFFLINE="1")
    assert res["reranked"] is False
    assert "downloads are off because HF_HUB_OFFLINE=1 is set in your environment" in res["warnings"][0]


def test_status_reports_an_unreachable_hub_without_loading(tmp_path, silent_endpoint):
    proc = subprocess.run([CLI, "--json", "status"], env=_env(tmp_path, silent_endpoint), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["reranker_available"] is False and report["reranker_loaded"] is False
    assert f"cannot reach the Hugging Face hub at {silent_endpoint}" in report["reranker_error"]


def test_loading_models_leaves_hub_settings_alone(tmp_path, tiny_cross_encoder):
    """The packaged embedder and a folder reranker load with no hub request and no process-wide change."""
    hub = FakeHub("nobody/nothing", tiny_cross_encoder)
    script = ("import json, os\n"
              "from research_agent.container import build_container\n"
              "c = build_container()\n"
              "dim = len(c.embedder.embed_query('x'))\n"
              "ok = c.reranker.load()\n"
              "import huggingface_hub.constants as hc\n"
              "print(json.dumps({'dim': dim, 'reranker': ok, 'error': c.reranker.error,\n"
              "                  'env': os.environ.get('HF_HUB_OFFLINE'), 'constant': hc.HF_HUB_OFFLINE}))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                              env=_env(tmp_path, hub.url, RESEARCH_AGENT_RERANKER_MODEL=str(tiny_cross_encoder)))
    finally:
        hub.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"dim": 384, "reranker": True, "error": None, "env": None, "constant": False}
    assert hub.requests == []


@pytest.mark.slow
def test_interrupted_download_is_fetched_again(tmp_path, corpus_store, tiny_cross_encoder):
    """A cache holding only config.json (a download cut short) does not pin the reranker as broken."""
    snapshot = tmp_path / "hf" / "hub" / f"models--{DEFAULT_RERANKER.replace('/', '--')}"
    (snapshot / "snapshots" / COMMIT).mkdir(parents=True)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text(COMMIT)
    shutil.copy(tiny_cross_encoder / "config.json", snapshot / "snapshots" / COMMIT / "config.json")
    hub = FakeHub(DEFAULT_RERANKER, tiny_cross_encoder)
    try:
        res = _query(tmp_path, corpus_store, hub.url, mode="keyword")
    finally:
        hub.stop()
    assert res["reranked"] is True and not res["warnings"], res["warnings"]
    assert any(path.endswith("/model.safetensors") for _, path in hub.requests)


def test_hub_probe_is_short_and_remembered(tiny_cross_encoder, silent_endpoint, monkeypatch):
    import huggingface_hub.constants

    from research_agent import embeddings

    monkeypatch.setattr(embeddings, "_probes", {})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as in a process started without it
    hub = FakeHub(DEFAULT_RERANKER, tiny_cross_encoder)
    try:
        assert embeddings.hub_problem(DEFAULT_RERANKER, hub.url) is None
        assert embeddings.hub_problem("other/model", hub.url) is None
    finally:
        hub.stop()
    assert hub.requests == [("HEAD", f"/api/models/{DEFAULT_RERANKER}")]  # one probe per endpoint
    problem = embeddings.hub_problem(DEFAULT_RERANKER, silent_endpoint)
    assert problem == f"cannot reach the Hugging Face hub at {silent_endpoint}: no answer within 1 s"
    assert embeddings._probes[silent_endpoint][0] == problem


def test_unreachable_hub_is_retried_later_offline_is_not(silent_endpoint, monkeypatch):
    """A long-running server tries the hub again after HUB_RETRY_SECONDS; 'downloads are off' is final."""
    import huggingface_hub.constants

    from research_agent import embeddings
    from research_agent.config import load_settings
    from research_agent.rerank import Reranker

    monkeypatch.setattr(embeddings, "_probes", {})
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", silent_endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as in a process started without it
    monkeypatch.delenv("HF_HUB_OFFLINE")
    settings = load_settings()
    rr = Reranker(settings)
    assert rr.load() is False and f"cannot reach the Hugging Face hub at {silent_endpoint}: no answer" in rr.error
    probed_at = embeddings._probes[silent_endpoint][1]
    assert rr.load() is False and embeddings._probes[silent_endpoint][1] == probed_at  # remembered
    monkeypatch.setattr(embeddings, "HUB_RETRY_SECONDS", 0.0)
    rr._retry_at = 0.0  # as if HUB_RETRY_SECONDS had passed
    assert rr.load() is False and embeddings._probes[silent_endpoint][1] > probed_at  # asked the hub again
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = Reranker(settings)
    assert offline.load() is False and "HF_HUB_OFFLINE=1 is set in your environment" in offline.error
    assert offline._retry_at is None


def test_a_reranker_that_arrives_on_disk_later_loads_in_a_long_running_process(tmp_path, tiny_cross_encoder):
    """Attack pass of 2026-11-25: a server that warmed up before the cross-encoder was on disk ("not in the local
    cache and downloads are off") kept answering unreranked after the user fetched it, as the warning told them
    to, while a new process reranked. An unavailable reranker is tried again once its model is on disk."""
    from research_agent.config import Settings
    from research_agent.rerank import Reranker

    later = tmp_path / "later-cross-encoder"
    reranker = Reranker(Settings(store=tmp_path / "store", reranker_model=str(later)))
    assert reranker.load() is False and reranker.error
    shutil.copytree(tiny_cross_encoder, later)
    assert reranker.load() is True and reranker.error is None
    assert reranker.score("query", ["a passage"]) is not None


def test_a_broken_reranker_folder_is_not_loaded_again_on_every_query(tmp_path, monkeypatch):
    """The retry above is for a model that was missing: a folder that is there and fails to load is tried once."""
    from research_agent import rerank
    from research_agent.config import Settings

    broken = tmp_path / "broken-cross-encoder"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    reranker = rerank.Reranker(Settings(store=tmp_path / "store", reranker_model=str(broken)))
    tries = []
    original = reranker._load
    monkeypatch.setattr(reranker, "_load", lambda *a, **k: tries.append(1) or original(*a, **k))
    assert reranker.load() is False and reranker.load() is False
    assert len(tries) <= 1


def test_a_reranker_name_with_an_unknown_user_is_unavailable_not_a_crash(tmp_path):
    """`~nosuchuser/model` raised RuntimeError from on_disk() inside load()'s failure handling (review of
    2026-11-25): every query failed "Unexpected failure" instead of answering unreranked."""
    from research_agent import embeddings
    from research_agent.config import Settings
    from research_agent.rerank import Reranker

    assert embeddings.on_disk("~nosuchuser-here/model") is False
    reranker = Reranker(Settings(store=tmp_path / "store", reranker_model="~nosuchuser-here/model"))
    assert reranker.load() is False and reranker.error
