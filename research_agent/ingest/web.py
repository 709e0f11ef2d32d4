"""Web pages as documents: `kb add-url URL...` and MCP `ingest_documents` with an http(s) URL (issue 17).

A page is fetched only from a host the configuration allows (`url_allowed_hosts`; empty = every URL refused,
so a knowledge base never reaches the network unless its owner says where), with bounds on size
(`url_max_mb`) and time (`url_timeout`, for the whole fetch, not per read), following at most
`MAX_REDIRECTS` redirects, each of which must land on an allowed host too. HTML is reduced to its main
content as Markdown by trafilatura (navigation, footers and comments dropped), falling back to our own HTML
parser when trafilatura finds no main content; Markdown, plain text and PDF are parsed as files are.

Each page is one document keyed `url:<canonical final URL>` (`normalise`: the URL after redirects under
RFC 3986 normalisation only; trailing slash, `//` and query kept), so `/page`, `/./page#x`, `/%70age` and a
redirect to `/page` are one document while `/page/` is another, with kind `web`, source = the final URL and provenance
`extra = {url, final_url, fetched_at, content_type}`. Adding a page again re-fetches it: an unchanged
page (same extracted text) writes nothing ("unchanged"), a changed one replaces its chunks ("updated")
through the same crash-safe write as files (ingest.service.write_documents), and a stored page that now
answers 404 or 410 is removed ("removed"). Only the document keyed by the fetched URL is replaced, and only
the one keyed by the requested URL is removed on a 404: never a page the URL once redirected to. A document
fetched from the same final URL under a legacy key (before keys were canonical) is removed once the page is
written under its canonical key; every removal is named in `removed_documents`.

Address checks: only http and https; no credentials in the URL (they would be stored as the source and
shown in every hit); a host written as a name that resolves to a loopback, private or link-local address
is refused unless that address (or `localhost`) is itself allowed — a public name pointed at 127.0.0.1
(DNS rebinding) does not reach local services. The check resolves the name before the request, so a
resolver that answers differently a second later can still slip through; the allow-list is the boundary.

Over 400 lines because the address checks, the bounded fetch and the page's key are one trust boundary: a
redirect is checked, fetched and keyed by the same rules, and splitting them would let one half change alone.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from pydantic import BaseModel

from research_agent.errors import ConfigError, DocumentError
from research_agent.text import clean_text

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

#: Redirect hops followed per URL (browsers allow ~20; documentation sites use one or two).
MAX_REDIRECTS = 5
#: URLs per call: each is a fetch of up to url_timeout seconds.
MAX_URLS = 50
#: The longest URL accepted (browsers and servers commonly stop near 8 KB).
MAX_URL_CHARS = 2048
#: Content types read, and how: everything else is refused with its type named.
_PARSERS = {"text/html": ".html", "application/xhtml+xml": ".html", "text/markdown": ".md",
            "text/x-markdown": ".md", "text/plain": ".txt", "application/pdf": ".pdf"}
_USER_AGENT = "research-agent (+https://github.com/research-agent) knowledge-base fetcher"


class UrlResult(BaseModel):
    url: str
    document: str | None = None
    title: str | None = None
    status: str  # added | updated | unchanged | removed (404/410 for a stored page) | failed
    chunks_written: int = 0
    final_url: str | None = None
    fetched_at: str | None = None
    reason: str | None = None
    #: Every document this URL's call deleted: the gone page, or older keys of the page just written.
    removed_documents: list[str] = []


class UrlReport(BaseModel):
    collection: str
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    results: list[UrlResult]


@dataclass
class Page:
    url: str
    final_url: str
    content_type: str
    body: bytes
    fetched_at: str
    charset: str | None = None  # from the Content-Type header


#: RFC 3986 §2.3 unreserved characters: percent-encoding one of these does not change the URL (`%6F` is `o`).
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def normalise(url: str) -> str:
    """A page's canonical URL, the document key's part: RFC 3986 §6.2.2-6.2.3 normalisation only — scheme and
    host lowercased, the default port dropped, an empty path as `/`, percent-encoding of unreserved characters
    decoded and other escapes upper-cased, dot segments resolved, the fragment dropped
    (`HTTPS://Host:443/a/./%62/../c/#x` -> `https://host/a/c/`). The trailing slash, a `//` and the query are
    KEPT: `/page` and `/page/` (or `//page`) are different resources to a static host, and sharing one key
    let adding one overwrite the other and a 404 on one delete the other (outside tester). A server that
    serves one page under two such paths without redirecting gives two documents; a duplicate is repairable,
    a deleted live page is not."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:  # a bad port (check_url refuses it before a fetch; a lookup by URL just finds nothing)
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    netloc = host if port in (None, default) else f"{host}:{port}"
    path = _remove_dot_segments(_percent(parts.path)) or "/"
    return urlunsplit((parts.scheme.lower(), netloc, path, _percent(parts.query), ""))


def _percent(text: str) -> str:
    """`%XX` of an unreserved character decoded, every other escape's hex upper-cased (RFC 3986 §6.2.2.1-2)."""
    def one(m: re.Match[str]) -> str:
        char = chr(int(m.group(1), 16))
        return char if char in _UNRESERVED else m.group(0).upper()

    decoded = re.sub(r"%([0-9A-Fa-f]{2})", one, text)
    # What is not printable ASCII (a space, `é`) is sent UTF-8 percent-encoded (httpx does): `/café` and
    # `/caf%C3%A9` are one resource and one key (re-attack: two documents).
    return re.sub(r"[^\x21-\x7e]", lambda m: "".join(f"%{b:02X}" for b in m[0].encode()), decoded)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 on segments: `.` dropped, `..` drops the segment before it; empty segments (`//`) and
    a trailing slash kept (posixpath.normpath dropped both)."""
    out: list[str] = []
    segments = path.split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg in (".", ".."):
            if seg == ".." and len(out) > 1:
                out.pop()
            if last:
                out.append("")  # `/a/b/..` is `/a/`
        else:
            out.append(seg)
    return "/".join(out) if path.startswith("/") or not path else "/" + "/".join(out)


def document_for(url: str) -> str:
    return f"url:{normalise(url)}"


def same_page(manifest: dict[str, Any], document: str) -> bool:
    """Whether a stored web document holds the page keyed `document`: its own key, or (a document keyed
    before keys were canonical) the canonical key of the URL its text was FETCHED from. Never the URL it was
    requested with: /s3 once redirected to /t3, so /t3's document recorded /s3, and matching on that deleted
    the live /t3 when /s3 became a page of its own or answered 404 (outside tester)."""
    if manifest.get("kind") != "web":
        return False
    extra = manifest.get("extra") if isinstance(manifest.get("extra"), dict) else {}
    fetched = extra.get("final_url") or manifest.get("source")
    if isinstance(fetched, str) and fetched:  # a page is the URL its text came from, whatever its key says:
        return document_for(fetched) == document  # d107746 kept /page/ as `url:…/page`; a 404 on /page took it
    return manifest.get("document") == document


def stored_pages(c: Container, collection: str, document: str) -> dict[str, dict[str, Any]]:
    """The manifests of the page keyed `document`: its key, and any legacy key of the same fetched URL."""
    return {k: m for k, m in c.store.registry_find("document", collection).items() if same_page(m, document)}


def check_url(url: Any, allowed: list[str]) -> str:
    """`url` if it may be fetched, else DocumentError (bad URL) or ConfigError (host not allowed)."""
    if not isinstance(url, str) or not url.strip():
        raise DocumentError("The URL is empty", guidance="Pass an http(s) URL.")
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise DocumentError(f"The URL has {len(url)} characters; the limit is {MAX_URL_CHARS}",
                            guidance="Pass the page's canonical URL.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        why = "" if "@" in url else f" ({exc})"  # urllib's reason quotes the part it read as a port: a password
        raise DocumentError(f"Not a valid URL: {_redacted(url)[:200]!r}{why}",
                            guidance="Pass an http(s) URL.") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise DocumentError(f"Only http and https URLs are fetched, not {_redacted(url)[:200]!r}",
                            guidance="Pass an http(s) URL; add local files with kb add-document.")
    if parts.username or parts.password:
        raise DocumentError("URLs with credentials are refused (they would be stored and shown as the source)",
                            guidance="Pass the URL without user:password@.")
    host = parts.hostname.lower()
    if not host_allowed(host, allowed):
        raise ConfigError(f"The host {host[:200]!r} is not allowed",
                          guidance="Add it to RESEARCH_AGENT_URL_ALLOWED_HOSTS (comma-separated host names; "
                                   "*.example.com allows subdomains).", host=host[:200])
    _check_address(host, allowed)
    return url


def host_allowed(host: str, allowed: list[str]) -> bool:
    for entry in (a.strip().lower().rstrip(".") for a in allowed):
        if entry == "*" or entry == host:
            return True
        if entry.startswith("*.") and (host.endswith(entry[1:]) or host == entry[2:]):
            return True
    return False


def _check_address(host: str, allowed: list[str]) -> None:
    """A loopback, private or link-local address (literal, or what a name resolves to) must be allowed by itself."""
    named = [a.strip().lower() for a in allowed]
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        if host == "localhost" and "localhost" in named:
            return
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError) as exc:
            raise DocumentError(f"Cannot resolve {host[:200]!r}: {exc}", guidance="Check the URL and the network.",
                                host=host[:200]) from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    for addr in addresses:
        # "*" does not reach these: 169.254.169.254 (cloud metadata) or a local admin port stay closed unless named.
        if _internal(addr) and str(addr) not in named:
            raise ConfigError(f"{host[:200]!r} resolves to the internal address {addr}; it is not fetched",
                              guidance=f"Allow {addr} itself in RESEARCH_AGENT_URL_ALLOWED_HOSTS if this is "
                                       "intended.", host=host[:200])


#: IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64, RFC 6052 and 8215).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def _internal(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Not a public address: loopback, private, link-local, shared (100.64.0.0/10, CGNAT/Tailscale), reserved,
    unspecified, multicast — `is_global` is false for each; `is_private` missed 100.64/10 (outside tester) —
    or an IPv6 form of one (IPv4-mapped ::ffff:a.b.c.d, NAT64 64:ff9b::a.b.c.d)."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return _internal(addr.ipv4_mapped)
        if any(addr in net for net in _NAT64):
            return _internal(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return not addr.is_global or addr.is_multicast


def fetch(url: str, *, allowed: list[str], max_bytes: int, timeout: float) -> Page:
    """GET `url` within the bounds (module docstring); redirects are followed by hand so each hop is checked.

    `timeout` bounds the whole fetch, headers included: httpx's timeouts are per read, so a server sending one
    header line a second held an MCP call (and the store's read gate, which other processes' writes wait for)
    for minutes (outside tester). The fetch runs as a coroutine under one deadline instead."""
    import asyncio

    try:
        return asyncio.run(asyncio.wait_for(_fetch(url, allowed, max_bytes, timeout), timeout))
    except TimeoutError:
        raise DocumentError(f"{_redacted(url)[:200]} did not answer within {timeout:g} s",
                            guidance="Retry, or raise RESEARCH_AGENT_URL_TIMEOUT.") from None


async def _fetch(url: str, allowed: list[str], max_bytes: int, timeout: float) -> Page:
    import httpx

    current = normalise(url)  # fetch what the key names: httpx resolves `/page/.` to `/page` (RFC 3986: `/page/`)
    async with httpx.AsyncClient(follow_redirects=False, timeout=httpx.Timeout(timeout),
                                 headers={"User-Agent": _USER_AGENT, "Accept": ", ".join(_PARSERS)}) as client:
        for _ in range(MAX_REDIRECTS + 1):
            check_url(current, allowed)
            try:
                async with client.stream("GET", current) as resp:
                    if resp.is_redirect:
                        current = normalise(urljoin(current, resp.headers.get("location", "")))
                        continue
                    if resp.status_code >= 400:
                        raise DocumentError(f"{current[:200]} answered HTTP {resp.status_code}",
                                            guidance="Check the URL.", status=resp.status_code)
                    body = await _read_bounded(resp, max_bytes, current)
                    kind = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                    return Page(url, current, kind, body, _now(), resp.charset_encoding)
            except httpx.TimeoutException:
                raise DocumentError(f"{current[:200]} did not answer within {timeout:g} s",
                                    guidance="Retry, or raise RESEARCH_AGENT_URL_TIMEOUT.") from None
            except httpx.HTTPError as exc:
                raise DocumentError(f"Cannot fetch {current[:200]}: {type(exc).__name__}: {str(exc)[:200]}",
                                    guidance="Check the URL and the network.") from None
    raise DocumentError(f"{_redacted(url)[:200]} redirected more than {MAX_REDIRECTS} times",
                        guidance="Pass the final URL.")


async def _read_bounded(resp: Any, max_bytes: int, url: str) -> bytes:
    """The body, refused past `max_bytes` of DECODED bytes (a gzip bomb is counted as it inflates)."""
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes and not resp.headers.get("content-encoding"):
        raise DocumentError(f"{url[:200]} is {int(declared)} bytes; the limit is {max_bytes}",
                            guidance="Raise RESEARCH_AGENT_URL_MAX_MB to fetch it.")
    out = bytearray()
    async for block in resp.aiter_bytes():
        out += block
        if len(out) > max_bytes:
            raise DocumentError(f"{url[:200]} is over {max_bytes} bytes", guidance="Raise RESEARCH_AGENT_URL_MAX_MB.")
    return bytes(out)


def _now() -> str:
    from research_agent.catalog.collections import now_iso

    return now_iso()


def page_markdown(page: Page) -> tuple[str, str | None]:
    """(Markdown text, title) of a fetched page; DocumentError for a type we do not read or an empty page."""
    from research_agent.ingest import parsing

    suffix = _PARSERS.get(page.content_type)
    if suffix is None and not page.content_type:
        suffix = ".html" if page.body.lstrip()[:1] == b"<" else ".txt"
    if suffix is None:
        raise DocumentError(f"{page.final_url[:200]} is {page.content_type!r}, not a page we read",
                            guidance="Pages in HTML, Markdown, plain text or PDF are read.")
    if suffix == ".html":
        text, title = _main_content(page)
        if text:
            return text, title
    parsed = parsing.parse_bytes(page.body, Path(f"page{suffix}"))
    return parsed.text, parsed.title


def _main_content(page: Page) -> tuple[str | None, str | None]:
    """trafilatura's main content as Markdown, and the page title (None, None when it finds nothing)."""
    import trafilatura

    html = _decoded(page)
    try:
        text = trafilatura.extract(html, url=page.final_url, output_format="markdown", include_tables=True,
                                   include_comments=False, include_links=False, favor_precision=True)
        meta = trafilatura.extract_metadata(html)
    except Exception as exc:  # a parser failure on hostile markup: fall back to our own HTML reader
        log.warning("main-content extraction failed for %s: %s", page.final_url[:200], exc)
        return None, None
    title = getattr(meta, "title", None) if meta is not None else None
    return (_tidy(clean_text(text)) if text and text.strip() else None), title


def _decoded(page: Page) -> str:
    """The page's text in its declared charset (header, else `<meta charset>`), else UTF-8: a Latin-1 page read
    as UTF-8 showed "Caf\ufffd" (outside tester)."""
    import codecs

    charset = page.charset
    if not charset:
        found = re.search(rb"""<meta[^>]+charset=["']?([\w.:-]{1,40})""", page.body[:4096], re.IGNORECASE)
        charset = found.group(1).decode("ascii") if found else None
    try:
        codecs.lookup(charset or "utf-8")
    except LookupError:
        charset = None
    return page.body.decode(charset or "utf-8", "replace")


def _tidy(markdown: str) -> str:
    """trafilatura's Markdown with identifiers whole and tables separated: it writes `max\\_surge` (so BM25 saw
    "max" and "surge", and an identifier search missed it) and starts a table right under a paragraph line
    (so our parser read it as text)."""
    markdown = re.sub(r"\\([_*])", r"\1", markdown)
    return re.sub(r"(?m)^([^|\n][^\n]*)\n(?=\|)", r"\1\n\n", markdown)


def add_urls(c: Container, collection: str, urls: list[str]) -> UrlReport:
    """Fetch and store each URL (module docstring); one failure is reported and the others go on."""
    from research_agent.catalog.collections import open_collection
    from research_agent.ingest.service import recover_if_needed

    if not isinstance(urls, list) or not urls:
        raise DocumentError("No URL given", guidance="Pass one or more http(s) URLs.")
    if len(urls) > MAX_URLS:
        raise DocumentError(f"{len(urls)} URLs in one call; the limit is {MAX_URLS}", guidance="Split the list.")
    s = c.settings
    if not s.url_allowed_hosts:
        raise ConfigError("Fetching web pages is off: no host is allowed",
                          guidance="Set RESEARCH_AGENT_URL_ALLOWED_HOSTS to the hosts you trust, e.g. "
                                   "docs.python.org,*.readthedocs.io.")
    c.store.refresh()
    open_collection(c, collection)
    recover_if_needed(c, collection)
    results = [_add_one(c, collection, url) for url in dict.fromkeys(urls)]
    counts = {k: sum(r.status == k for r in results) for k in ("added", "updated", "unchanged", "removed", "failed")}
    return UrlReport(collection=collection, results=results, **counts)


#: HTTP answers that say a page is no more: its stored document is removed (`kb add-url` on it again).
GONE_STATUSES = frozenset({404, 410})


def _add_one(c: Container, collection: str, url: Any) -> UrlResult:
    shown = _redacted(url[:MAX_URL_CHARS]) if isinstance(url, str) else repr(url)[:200]
    try:
        return _fetch_and_write(c, collection, check_url(url, c.settings.url_allowed_hosts))
    except (DocumentError, ConfigError) as exc:
        if isinstance(exc, DocumentError) and exc.data.get("status") in GONE_STATUSES:
            return _remove_gone(c, collection, url, shown, exc.message)
        return UrlResult(url=shown, status="failed", reason=exc.message)


def _remove_gone(c: Container, collection: str, url: str, shown: str, reason: str) -> UrlResult:
    """A stored page that now answers 404 or 410 is removed ("removed"); one never stored is a failure. Only
    the document keyed by the URL asked for (or a legacy key of a page fetched from that URL) is removed, never
    one the URL once redirected to: that page may well be live."""
    from research_agent.ingest.service import delete_documents

    document = document_for(url)
    stored = stored_pages(c, collection, document)
    if not stored:
        return UrlResult(url=shown, status="failed", reason=reason)
    delete_documents(c, collection, stored)
    return UrlResult(url=shown, document=document, status="removed", reason=reason,
                     removed_documents=sorted(m["document"] for m in stored.values()))


def _redacted(url: str) -> str:
    """The URL without its user part, for reports, reasons and logs: everything between `://` and the LAST `@`
    (a password may hold `/` or `@`, and a leading space hid one from an anchored pattern; outside tester)."""
    return re.sub(r"^(\s*[a-zA-Z][\w+.-]*://).*@", r"\1***@", url, flags=re.DOTALL)


def _fetch_and_write(c: Container, collection: str, url: str) -> UrlResult:
    from research_agent.ingest.parsing import parse_text
    from research_agent.ingest.prepare import PreparedDocument, chunk_parsed, content_hash, document_key
    from research_agent.ingest.service import write_documents

    s = c.settings
    page = fetch(url, allowed=s.url_allowed_hosts, max_bytes=int(s.url_max_mb * 1024 * 1024),
                 timeout=s.url_timeout)
    text, title = page_markdown(page)
    if not text.strip():
        raise DocumentError(f"{page.final_url[:200]} has no text", guidance="Check that the URL is a page.")
    document = document_for(page.final_url)  # one key per page, however it was reached (normalise)
    title = clean_text(title or "") or page.final_url
    digest = content_hash(f"{title}\n{text}")
    key = document_key(collection, document)
    stored = stored_pages(c, collection, document)
    old, stale = stored.get(key), {k: m for k, m in stored.items() if k != key}  # stale: legacy keys of the page
    base = {"url": url, "document": document, "title": title, "final_url": page.final_url,
            "fetched_at": page.fetched_at}
    if old is not None and old.get("content_hash") == digest:
        return UrlResult(**base, status="unchanged", removed_documents=_drop_stale(c, collection, stale))
    chunks = chunk_parsed(c, parse_text(text, format="markdown", name=title), document, title)
    if len(chunks) > s.max_chunks_per_file:
        raise DocumentError(f"{len(chunks)} chunks exceed the limit of {s.max_chunks_per_file} per document",
                            guidance="Raise RESEARCH_AGENT_MAX_CHUNKS_PER_FILE.")
    source = urlunsplit(urlsplit(page.final_url)._replace(fragment=""))
    doc = PreparedDocument(document=document, title=title, kind="web", source=source, content_hash=digest,
                           chunks=chunks, extra={"url": url, "final_url": page.final_url,
                                                 "fetched_at": page.fetched_at, "content_type": page.content_type})
    written = write_documents(c, collection, [doc])
    dropped = _drop_stale(c, collection, stale)  # after the new version is visible: a kill leaves both, not none
    return UrlResult(**base, status="updated" if stored else "added", chunks_written=written,
                     removed_documents=dropped)


def _drop_stale(c: Container, collection: str, stale: dict[str, dict[str, Any]]) -> list[str]:
    """Delete legacy keys of the page just written; their names, for the report."""
    from research_agent.ingest.service import delete_documents

    names = sorted(m["document"] for m in stale.values())
    if stale:
        log.info("removing %d older key(s) of one page: %s", len(stale), names)
        delete_documents(c, collection, stale)
    return names
