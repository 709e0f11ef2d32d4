"""Web pages as documents (issue 17): `kb add-url` / `ingest_url` against a real local HTTP server.

The server is a stdlib ThreadingHTTPServer on 127.0.0.1 serving fixed pages, redirects, oversized and slow
bodies; the store is a real embedded Chroma. The fake embedder serves the logic tests; one CLI test runs the
real packaged model end to end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from research_agent.catalog import collections
from research_agent.errors import ConfigError, DocumentError
from research_agent.ingest import web

ROOT = Path(__file__).resolve().parent.parent

ARTICLE = """<html><head><title>Deploying the widget service</title></head><body>
<nav><a href="/">Home</a> | <a href="/pricing">Pricing</a> | <a href="/login">Login</a></nav>
<article><h1>Deploying the widget service</h1>
<p>To deploy the widget service, build the container image with <code>make image</code> and push it to the
registry. The rollout controller then replaces pods one at a time and waits for the readiness probe.</p>
<h2>Rolling back</h2>
<p>If the readiness probe fails three times the controller rolls back to the previous image automatically;
operators can also run the rollback command by hand with the release number.</p>
<table><tr><th>setting</th><th>default</th></tr><tr><td>max_surge</td><td>1</td></tr></table>
</article>
<footer>Copyright 2026 Widget Corp. All rights reserved. Cookie settings. Subscribe to our newsletter.</footer>
</body></html>"""


class Pages:
    """What the server answers; tests change `article` to simulate a page edited between fetches."""

    article = ARTICLE
    hits = 0
    gone = False


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def _send(self, code: int, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _same_page_routes(self, port: int) -> bool:
        """One page under several URLs, a page that goes away (Pages.gone), a binary; False for another path."""
        if self.path == "/moved":  # a permanent move to the page, with a fragment and a doubled slash
            self._send(301, b"", "text/plain", {"Location": f"http://127.0.0.1:{port}//page.html#top"})
        elif self.path == "/docs":
            self._send(301, b"", "text/plain", {"Location": "/docs/"})
        elif self.path == "/docs/":
            self._send(200, b"# Docs index\n\nThe docs index lists the widget guides.\n", "text/markdown")
        elif self.path == "/gone.md" and Pages.gone:
            self._send(410, b"gone", "text/plain")
        elif self.path == "/gone.md":
            self._send(200, b"# Retired page\n\nThe retired widget API is described here.\n", "text/markdown")
        elif self._moving_routes():
            pass
        elif self.path == "/binary":
            self._send(200, b"\x00\x01\x02", "application/octet-stream")
        else:
            return False
        return True

    def _moving_routes(self) -> bool:
        """Pages whose URLs change meaning once Pages.gone is set: a redirect source that becomes its own page
        (/s3), a redirect source that becomes 404 (/old), and `/static` and `/static/`, two pages of a static
        host, the second of which goes away."""
        md = "text/markdown"
        routes = {
            "/s3": (200, b"# S3 page\n\nThe s3 page now has its own text.\n") if Pages.gone else (301, "/t3"),
            "/t3": (200, b"# T3 page\n\nThe t3 page is where s3 used to redirect.\n"),
            "/old": (404, b"not found") if Pages.gone else (301, "/new"),
            "/new": (200, b"# New page\n\nThe new page is live.\n"),
            "/static": (200, b"# Static file\n\nThe file without a slash.\n"),
            "/static/": (404, b"not found") if Pages.gone else (200, b"# Static index\n\nThe index with a slash.\n"),
            "/lone": (404, b"not found") if Pages.gone else (200, b"# Lone file\n\nThe lone file without a slash.\n"),
            "/lone/": (200, b"# Lone index\n\nThe lone index with a slash.\n"),
        }
        if self.path not in routes:
            return False
        code, what = routes[self.path]
        if code == 301:
            self._send(301, b"", "text/plain", {"Location": what})
        else:
            self._send(code, what, md)
        return True

    def do_GET(self):  # noqa: N802 - the stdlib's name
        Pages.hits += 1
        port = self.server.server_address[1]
        # as nginx reads a path: escapes decoded, merge_slashes (on by default)
        self.path = re.sub("/{2,}", "/", unquote(self.path))
        if self.path == "/page.html":
            self._send(200, Pages.article.encode(), "text/html; charset=utf-8")
        elif self.path == "/notes.md":
            self._send(200, b"# Release notes\n\nVersion 2 adds the rollback command.\n", "text/markdown")
        elif self.path == "/redirect":
            self._send(302, b"", "text/plain", {"Location": "/page.html"})
        elif self.path == "/redirect-out":
            self._send(302, b"", "text/plain", {"Location": "http://not-allowed.invalid/"})
        elif self.path == "/redirect-loop":
            self._send(302, b"", "text/plain", {"Location": f"http://127.0.0.1:{port}/redirect-loop"})
        elif self.path == "/big-declared":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(10 * 1024 * 1024 * 1024))
            self.end_headers()
        elif self.path == "/big-chunked":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()  # no length: the body runs until the connection closes
            try:
                for _ in range(4096):
                    self.wfile.write(b"x" * 65536)
            except OSError:
                pass
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(120):
                    self.wfile.write(b"drip ")
                    self.wfile.flush()
                    time.sleep(0.25)
            except OSError:
                pass
        elif self.path == "/latin1.html":
            body = ("<html><head><title>Menu</title></head><body><article><h1>Menu</h1><p>" + "Café naïve résumé "
                    "with crème brûlée for dessert, served every day after lunch in the garden. " * 3
                    + "</p></article></body></html>").encode("latin-1")
            self._send(200, body, "text/html; charset=iso-8859-1")
        elif self._same_page_routes(port):
            pass
        else:
            self._send(404, b"not found", "text/plain")


@pytest.fixture
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Pages.article, Pages.hits, Pages.gone = ARTICLE, 0, False
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def kb(container, fake_embedder):
    container.settings.url_allowed_hosts = ["127.0.0.1"]
    container.settings.url_timeout = 3.0
    collections.create_collection(container, "web")
    return container


def _chunks(c, document: str) -> list[str]:
    from research_agent.ingest import get_document_chunks

    return [ch.content for ch in get_document_chunks(c, "web", document).chunks]


def test_fetching_is_off_until_a_host_is_allowed(container, fake_embedder, site):
    collections.create_collection(container, "web")
    with pytest.raises(ConfigError) as exc:
        web.add_urls(container, "web", [f"{site}/page.html"])
    assert "RESEARCH_AGENT_URL_ALLOWED_HOSTS" in exc.value.data["guidance"] and Pages.hits == 0


def test_a_page_is_stored_as_its_main_content_with_provenance(kb, site):
    report = web.add_urls(kb, "web", [f"{site}/page.html"])
    (r,) = report.results
    assert (r.status, report.added) == ("added", 1) and r.document == f"url:{site}/page.html"
    assert r.title == "Deploying the widget service" and r.fetched_at and r.chunks_written >= 1
    text = "\n".join(_chunks(kb, r.document))
    assert "readiness probe" in text and "rolls back to the previous image" in text and "max_surge" in text
    assert "Cookie settings" not in text and "Pricing" not in text  # navigation and footer dropped
    from research_agent.ingest import find_document

    manifest = next(iter(find_document(kb, "web", r.document).values()))
    assert manifest["kind"] == "web" and manifest["source"] == f"{site}/page.html"
    assert manifest["extra"]["final_url"] == f"{site}/page.html" and manifest["extra"]["fetched_at"]


def test_adding_again_refreshes_by_content(kb, site):
    url = f"{site}/page.html"
    web.add_urls(kb, "web", [url])
    again = web.add_urls(kb, "web", [url]).results[0]
    assert (again.status, again.chunks_written) == ("unchanged", 0)
    Pages.article = ARTICLE.replace("three times", "five times")
    changed = web.add_urls(kb, "web", [url]).results[0]
    assert changed.status == "updated" and changed.chunks_written >= 1
    text = "\n".join(_chunks(kb, changed.document))
    assert "five times" in text and "three times" not in text  # the old version's chunks are gone


def test_redirects_are_followed_on_allowed_hosts_only(kb, site):
    ok, out, loop = web.add_urls(kb, "web", [f"{site}/redirect", f"{site}/redirect-out",
                                             f"{site}/redirect-loop"]).results
    assert ok.status == "added" and ok.final_url == f"{site}/page.html"
    assert out.status == "failed" and "not-allowed.invalid" in out.reason and "not allowed" in out.reason
    assert loop.status == "failed" and "redirected more than" in loop.reason


def test_oversized_slow_and_foreign_pages_fail_with_their_reason(kb, site):
    kb.settings.url_max_mb = 1.0
    kb.settings.url_timeout = 2.0
    start = time.monotonic()
    declared, chunked, slow, binary, missing, md = web.add_urls(kb, "web", [
        f"{site}/big-declared", f"{site}/big-chunked", f"{site}/slow", f"{site}/binary", f"{site}/nope",
        f"{site}/notes.md"]).results
    assert time.monotonic() - start < 60  # bounded (the slow page alone would drip for 30 s)
    assert declared.status == "failed" and "limit is 1048576" in declared.reason
    assert chunked.status == "failed" and "over 1048576 bytes" in chunked.reason
    assert slow.status == "failed" and ("within 2 s" in slow.reason or "time limit" in slow.reason)
    assert binary.status == "failed" and "application/octet-stream" in binary.reason
    assert missing.status == "failed" and "HTTP 404" in missing.reason
    assert md.status == "added" and "rollback command" in "\n".join(_chunks(kb, md.document))


@pytest.mark.parametrize("url,fragment", [
    ("ftp://127.0.0.1/file", "Only http and https"),
    ("http://user:secret@127.0.0.1/page.html", "credentials"),
    # outside tester (A2): each of these showed the password in the reason or the echoed url
    ("http://user:secret@127.0.0.1:99999/", "Not a valid URL"),
    ("ftp://user:secret@127.0.0.1/", "Only http and https"),
    ("http://user:secret/pw4@127.0.0.1/", ""),
    ("http://user:p@secret@127.0.0.1/", "credentials"),
    (" http://user:secret@127.0.0.1/", "credentials"),
    ("http://127.0.0.1:99999/", "Not a valid URL"),
    ("http://127.0.0.1/" + "a" * 3000, "the limit is 2048"),
    ("", "empty"),
])
def test_bad_urls_are_refused_before_any_request(kb, site, url, fragment):
    (r,) = web.add_urls(kb, "web", [url]).results
    assert r.status == "failed" and fragment in r.reason and Pages.hits == 0
    assert "secret" not in json.dumps(r.model_dump())


def test_internal_addresses_need_naming_themselves(kb, site):
    port = site.rsplit(":", 1)[1]
    kb.settings.url_allowed_hosts = ["*"]  # any public host: still not loopback, private or link-local
    literal, name, metadata = web.add_urls(kb, "web", [f"{site}/page.html", f"http://localhost:{port}/page.html",
                                                       "http://169.254.169.254/latest/meta-data/"]).results
    assert all(r.status == "failed" for r in (literal, name, metadata)) and Pages.hits == 0
    assert "internal address 127.0.0.1" in literal.reason and "localhost" in name.reason
    kb.settings.url_allowed_hosts = ["localhost"]
    assert web.add_urls(kb, "web", [f"http://localhost:{port}/page.html"]).results[0].status == "added"


def test_too_many_urls_and_wildcards():
    with pytest.raises(DocumentError):
        web.check_url("gopher://x", ["*"])
    assert web.host_allowed("docs.example.com", ["*.example.com"]) and web.host_allowed("example.com",
                                                                                         ["*.example.com"])
    assert not web.host_allowed("example.com.evil.net", ["*.example.com"])
    assert not web.host_allowed("badexample.com", ["*.example.com"])
    assert web.normalise("HTTP://Docs.Example.com:80/a?b=1#frag") == "http://docs.example.com/a?b=1"


def test_too_many_urls_in_one_call(kb):
    with pytest.raises(DocumentError, match="limit is 50"):
        web.add_urls(kb, "web", [f"http://127.0.0.1/{i}" for i in range(51)])


@pytest.mark.slow
def test_cli_add_url_then_query_finds_the_page(tmp_path, site):
    """The real CLI in a new process with the packaged model: add a page, ask about it, get it back."""
    env = {**os.environ, "RESEARCH_AGENT_STORE": str(tmp_path / "store"),
           "RESEARCH_AGENT_URL_ALLOWED_HOSTS": "127.0.0.1", "HF_HUB_OFFLINE": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "research_agent", "--json", *args], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    added = cli("kb", "add-url", f"{site}/page.html", f"{site}/nope", "--collection", "web", "--create")
    assert added.returncode == 0, added.stderr  # one of two failed: listed, not fatal (as add-folder)
    report = json.loads(added.stdout)
    assert (report["added"], report["failed"]) == (1, 1)
    failed = cli("kb", "add-url", f"{site}/nope", "--collection", "web")
    assert failed.returncode == 5 and json.loads(failed.stdout)["failed"] == 1
    answer = json.loads(cli("query", "how do I roll back a failed deploy?", "--collections", "web").stdout)
    assert answer["results"], answer
    assert answer["results"][0]["source_document"] == f"url:{site}/page.html", answer["results"][0]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_ingest_documents_takes_a_url_on_the_same_library_call(site, fake_embedder, no_warmup, monkeypatch,
                                                                       anyio_backend):
    """ingest_documents with a URL through a real in-memory MCP client: the same report as kb add-url; a refused
    host is a per-URL failure, and with no host allowed the call is a -32001 configuration error with guidance."""
    from fastmcp import Client
    from mcp.shared.exceptions import MCPError

    import mcp_server

    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "web"})
        with pytest.raises(MCPError, match="RESEARCH_AGENT_URL_ALLOWED_HOSTS"):
            await client.call_tool("ingest_documents", {"path": f"{site}/page.html", "collection": "web"})
    monkeypatch.setenv("RESEARCH_AGENT_URL_ALLOWED_HOSTS", "127.0.0.1")
    async with Client(mcp_server.mcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
        assert tools["ingest_documents"].annotations.openWorldHint is True
        result = await client.call_tool("ingest_documents", {"path": f"{site}/page.html", "collection": "web"})
        refused = await client.call_tool("ingest_documents", {"path": "http://example.org/", "collection": "web"})
    data = result.structured_content
    assert (data["added"], data["failed"]) == (1, 0)
    assert refused.structured_content["failed"] == 1 and "not allowed" in refused.structured_content["results"][0][
        "reason"]
    assert "Deploying the widget service" in result.content[0].text


@pytest.mark.parametrize("address", ["100.64.0.1", "[64:ff9b::7f00:1]", "[::ffff:10.0.0.1]", "0.0.0.0",
                                     "[::]", "224.0.0.1", "198.18.0.1"])
def test_shared_nat64_and_reserved_addresses_are_internal(address):
    """Outside tester (A4): with `*` allowed, 100.64.0.1 (CGNAT, Tailscale) and 64:ff9b::7f00:1 (NAT64 for
    127.0.0.1) passed: `is_private` does not cover them."""
    with pytest.raises(ConfigError, match="internal address"):
        web.check_url(f"http://{address}/", ["*"])
    assert web.check_url("http://93.184.216.34/", ["*"])  # a public address literal stays allowed under "*"


def test_a_server_that_trickles_its_headers_is_cut_at_the_whole_fetch_deadline(kb):
    """Outside tester (A4): one header line a second kept a fetch (and the MCP call, and the store's read gate
    other processes' writes wait for) going for 120 s with url_timeout 8: httpx's timeouts are per read."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    stop = threading.Event()

    def trickle():
        conn, _ = server.accept()
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
            time.sleep(0.5)
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    kb.settings.url_timeout = 2.0
    start = time.monotonic()
    try:
        (r,) = web.add_urls(kb, "web", [f"http://127.0.0.1:{server.getsockname()[1]}/"]).results
    finally:
        stop.set()
        server.close()
    assert r.status == "failed" and "within 2 s" in r.reason
    assert time.monotonic() - start < 30  # a bound against the old behaviour (minutes), not a timing goal


def test_a_page_is_read_in_its_declared_charset(kb, site):
    """Outside tester (A2): a Latin-1 page was decoded as UTF-8 and stored as "Caf\ufffd na\ufffdve"."""
    (r,) = web.add_urls(kb, "web", [f"{site}/latin1.html"]).results
    text = "\n".join(_chunks(kb, r.document))
    assert r.status == "added" and "Café naïve résumé" in text and "\ufffd" not in text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_refuses_other_schemes_and_a_url_with_records(fake_embedder, no_warmup, anyio_backend):
    """Outside tester (A4): `ftp://...` as ingest_documents' path was refused as "outside the allowed roots",
    and a `records` mapping beside a URL was silently ignored."""
    from fastmcp import Client
    from mcp.shared.exceptions import MCPError

    import mcp_server

    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "web"})
        for args in ({"path": "ftp://127.0.0.1/file.md"},
                     {"path": "http://127.0.0.1/x.jsonl", "records": {"id_field": "id", "text_fields": ["t"]}}):
            with pytest.raises(MCPError, match="Only http"):
                await client.call_tool("ingest_documents", {**args, "collection": "web"})


def test_one_page_under_several_urls_is_one_document(kb, site):
    """The key is the final URL after redirects under RFC 3986 normalisation: fragment and dot segments
    dropped, `%70` read as `p`. A redirect to a stored page, `#frag`, `./` and `%70` re-add it, never copy it;
    `//page.html` (kept: a different path to a server that does not merge slashes) is a second document."""
    first = web.add_urls(kb, "web", [f"{site}/page.html"]).results[0]
    again = web.add_urls(kb, "web", [f"{site}/%70age.html", f"{site}/page.html#rolling-back", f"{site}/./page.html",
                                     f"{site}/redirect", f"{site}/x/../page.html"]).results
    assert [r.status for r in again] == ["unchanged"] * 5, [(r.status, r.reason) for r in again]
    assert {r.document for r in again} == {first.document} == {f"url:{site}/page.html"}
    moved = web.add_urls(kb, "web", [f"{site}/moved"]).results[0]
    assert (moved.document, moved.final_url) == (f"url:{site}//page.html", f"{site}//page.html")  # as fetched
    docs = web.add_urls(kb, "web", [f"{site}/docs/"]).results[0]
    assert docs.status == "added" and docs.document == f"url:{site}/docs/"
    assert web.add_urls(kb, "web", [f"{site}/docs"]).results[0].document == docs.document
    from research_agent.ingest import list_documents

    assert sorted(d.document for d in list_documents(kb, "web").documents) == [f"url:{site}//page.html",
                                                                              docs.document, first.document]


def test_a_page_stored_under_an_older_key_is_replaced_not_doubled(kb, site):
    """A store written by d107746 holds /docs/ as `url:http://host/docs` (it dropped the trailing slash);
    adding the page again moves it to its canonical key and removes (and names) the legacy document."""
    from research_agent.ingest import list_documents

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(web, "document_for", lambda url: "url:" + url.split("#")[0].rstrip("/"))  # d107746's key
        old = web.add_urls(kb, "web", [f"{site}/docs/"]).results[0]
    assert old.document == f"url:{site}/docs"
    moved = web.add_urls(kb, "web", [f"{site}/docs/"]).results[0]
    assert (moved.status, moved.document, moved.removed_documents) == ("updated", f"url:{site}/docs/",
                                                                       [old.document])
    assert [d.document for d in list_documents(kb, "web").documents] == [moved.document]


def test_url_documents_are_removed_by_any_spelling_of_their_url(kb, site):
    from research_agent.ingest import get_document, list_documents, remove_document

    stored = web.add_urls(kb, "web", [f"{site}/page.html", f"{site}/notes.md"]).results
    assert get_document(kb, "web", f"{site}/./page.html#x").document == stored[0].document
    deleted = remove_document(kb, "web", f"{site}/%70age.html")
    assert deleted.deleted == stored[0].document and deleted.chunks_removed >= 1
    removed = remove_document(kb, "web", stored[1].document)  # its key works as before
    assert removed.deleted == stored[1].document
    assert list_documents(kb, "web").documents == []
    for bad in ("https://127.0.0.1:99999999/x", "url:http://", "https://" + "x" * 5000):
        with pytest.raises(DocumentError, match="not found"):
            remove_document(kb, "web", bad)
    assert web.normalise("HTTPS://H:443/a/./b/../c?q=1#x") == "https://h/a/c?q=1"


def test_a_page_that_is_gone_is_removed_when_added_again(kb, site):
    """404 or 410 for a stored page removes its document (status "removed"); for a page never stored it is a
    failure, as before."""
    from research_agent.ingest import list_documents

    assert web.add_urls(kb, "web", [f"{site}/gone.md"]).results[0].status == "added"
    Pages.gone = True
    report = web.add_urls(kb, "web", [f"{site}/gone.md", f"{site}/never-there"])
    gone, never = report.results
    assert (gone.status, gone.document, report.removed) == ("removed", f"url:{site}/gone.md", 1)
    assert "410" in gone.reason and never.status == "failed" and "404" in never.reason
    assert list_documents(kb, "web").documents == []


def test_the_cli_report_names_a_removed_page(kb, site):
    from io import StringIO

    from rich.console import Console

    from research_agent.cli.web import url_report

    web.add_urls(kb, "web", [f"{site}/gone.md"])
    Pages.gone = True
    out = StringIO()
    url_report(Console(file=out, width=200), web.add_urls(kb, "web", [f"{site}/gone.md"]))
    assert f"removed url:{site}/gone.md: {site}/gone.md answered HTTP 410" in out.getvalue()
    assert "0 added, 0 updated, 0 unchanged, 1 removed, 0 failed in web." in out.getvalue()


def _keys(kb) -> list[str]:
    from research_agent.ingest import list_documents

    return sorted(d.document for d in list_documents(kb, "web").documents)


def test_re_adding_a_former_redirect_source_keeps_the_page_it_redirected_to(kb, site):
    """/s3 -> 301 -> /t3 is stored as url:/t3; once /s3 is a page of its own it is a second document, and
    /t3 (still live) stays: a page is matched by its own key, never by the URL it was once requested with
    (outside tester: url:/t3 was deleted as an "older key" of /s3)."""
    first = web.add_urls(kb, "web", [f"{site}/s3"]).results[0]
    assert first.document == f"url:{site}/t3"
    Pages.gone = True
    again = web.add_urls(kb, "web", [f"{site}/s3"]).results[0]
    assert (again.status, again.document, again.removed_documents) == ("added", f"url:{site}/s3", [])
    assert _keys(kb) == [f"url:{site}/s3", f"url:{site}/t3"]


def test_a_404_on_a_former_redirect_source_removes_nothing_else(kb, site):
    """/old redirected to /new (stored url:/new); /old now answers 404: nothing was stored under url:/old, so
    nothing is removed and the live url:/new stays."""
    assert web.add_urls(kb, "web", [f"{site}/old"]).results[0].document == f"url:{site}/new"
    Pages.gone = True
    report = web.add_urls(kb, "web", [f"{site}/old"])
    assert (report.results[0].status, report.removed) == ("failed", 0)
    assert _keys(kb) == [f"url:{site}/new"]


def test_remove_document_by_a_former_redirect_source_does_not_remove_its_target(kb, site):
    from research_agent.ingest import remove_document

    web.add_urls(kb, "web", [f"{site}/s3"])  # stored as url:/t3, requested as /s3
    with pytest.raises(DocumentError, match="not found"):
        remove_document(kb, "web", f"{site}/s3")
    assert _keys(kb) == [f"url:{site}/t3"]


def test_a_path_with_and_without_its_trailing_slash_are_two_documents(kb, site):
    """A static host serves /static and /static/ as two pages: adding one never overwrites the other, and a
    404 on /static/ removes only url:/static/ (outside tester: both shared one key)."""
    added = web.add_urls(kb, "web", [f"{site}/static", f"{site}/static/"]).results
    assert [(r.status, r.document) for r in added] == [("added", f"url:{site}/static"),
                                                       ("added", f"url:{site}/static/")]
    Pages.gone = True
    gone = web.add_urls(kb, "web", [f"{site}/static/"]).results[0]
    assert (gone.status, gone.document, gone.removed_documents) == ("removed", f"url:{site}/static/",
                                                                    [f"url:{site}/static/"])
    assert _keys(kb) == [f"url:{site}/static"]


@pytest.mark.parametrize(("url", "key"), [
    ("HTTPS://Host.Example:443/a/./b/../c/?q=1#x", "https://host.example/a/c/?q=1"),
    ("http://h:80", "http://h/"),
    ("http://h:8080/%7euser/%6Fk%2fx%3a", "http://h:8080/~user/ok%2Fx%3A"),
    ("http://h/page/", "http://h/page/"),
    ("http://h//page", "http://h//page"),
    ("http://h/a/%2e%2E/b?x=%6F&y=2", "http://h/b?x=o&y=2"),
    ("http://h/caf\u00e9 x", "http://h/caf%C3%A9%20x"),  # as httpx sends it: one key for both spellings
    ("http://h/caf%c3%a9%20x", "http://h/caf%C3%A9%20x"),
])
def test_the_canonical_key_is_rfc_3986_normalisation_only(url, key):
    assert web.normalise(url) == key


def test_a_dot_segment_url_fetches_the_page_it_is_keyed_under(kb, site):
    """`/static/.` is `/static/` under RFC 3986, but httpx requested `/static`: the other page's text was stored
    under `/static/`'s key, and a 404 there removed it (re-attack). The fetch now asks for the canonical URL."""
    from research_agent.ingest import get_document

    web.add_urls(kb, "web", [f"{site}/static", f"{site}/static/"])
    again = web.add_urls(kb, "web", [f"{site}/static/."]).results[0]
    assert (again.status, again.document) == ("unchanged", f"url:{site}/static/")
    assert "index with a slash" in get_document(kb, "web", f"url:{site}/static/").content


def test_a_legacy_key_never_stands_for_another_page(kb, site):
    """d107746 stored /lone/ as `url:…/lone`; a 404 on /lone (a different page) deleted it (re-attack). A
    stored page is identified by the URL its text was fetched from."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(web, "document_for", lambda url: "url:" + url.split("#")[0].rstrip("/"))  # d107746's key
        legacy = web.add_urls(kb, "web", [f"{site}/lone/"]).results[0]
    assert legacy.document == f"url:{site}/lone"
    Pages.gone = True
    gone = web.add_urls(kb, "web", [f"{site}/lone"]).results[0]
    assert (gone.status, gone.removed_documents) == ("failed", [])
    assert _keys(kb) == [f"url:{site}/lone"]
    assert web.add_urls(kb, "web", [f"{site}/lone/"]).results[0].removed_documents == [f"url:{site}/lone"]
    assert _keys(kb) == [f"url:{site}/lone/"]


def test_a_url_document_is_found_with_the_prefix_in_any_case(kb, site):
    from research_agent.ingest import get_document

    web.add_urls(kb, "web", [f"{site}/static/"])
    assert get_document(kb, "web", f"URL:{site}/static/").document == f"url:{site}/static/"


def test_the_cli_report_names_every_removed_document():
    """A legacy-key copy dropped while a page is written is named in people's output, not only in --json."""
    from types import SimpleNamespace

    from rich.console import Console

    from research_agent.cli.web import url_report

    item = SimpleNamespace(status="updated", url="https://h/docs/", document="url:https://h/docs/", chunks_written=2,
                           reason=None, removed_documents=["url:https://h/docs"])
    report = SimpleNamespace(results=[item], added=0, updated=1, unchanged=0, removed=0, failed=0, collection="web")
    console = Console(record=True, width=200)
    url_report(console, report)
    assert "removed url:https://h/docs (older key of url:https://h/docs/)" in console.export_text()
