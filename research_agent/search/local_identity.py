"""Who may answer over the local query socket (search/local_server.py): the fingerprint a server and a CLI must
share (the resolved store, every setting but the transport/log/limit ones in IGNORED_SETTINGS, the state of the boosts
file and model folders the settings name, the package version, the protocol and `code_hash` of the package's .py
files), and `usable`: when the socket is not used at all (turned off, a Chroma server, not Linux, a relative path a
server's working directory would resolve to another file). Standard library only, as the CLI's side is.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sys
from pathlib import Path

from research_agent import __version__
from research_agent.config import Settings

PROTOCOL = 2  # 2: keep-alive lines while a call runs
#: Settings that never change a query's answer (how the server is reached, logged, bounded, what ingest accepts).
#: Every other setting is part of the fingerprint: a new setting counts until listed here (the safe direction).
IGNORED_SETTINGS = frozenset({
    "transport", "host", "port", "auth_type", "api_keys", "allowed_hosts", "allowed_origins", "max_http_sessions",
    "http_session_idle_timeout", "http_header_timeout", "http_body_timeout", "warmup", "max_concurrent_calls",
    "call_timeout", "log_level", "log_file", "lock_timeout", "chroma_connect_timeout", "allowed_roots",
    "url_allowed_hosts", "url_max_mb", "url_timeout", "max_file_mb", "max_pdf_mb", "max_files_per_run",
    "local_server",
})
#: Settings that may name a file or folder (a model may also be a hub name). A relative one is never served (it names
#: another file in the server's working directory, `usable`); an absolute one is hashed with its files' state.
PATH_SETTINGS = ("discovery_boosts_file", "embedding_model", "reranker_model")
_STATE_FILES = 200  # files of a model folder whose size and times are hashed (a sentence-transformers folder: ~15)


def fingerprint(settings: Settings) -> str:
    """A hash of everything that changes an answer: the store (resolved), the settings, the code (version and
    `code_hash`)."""
    values = settings.model_dump(mode="json")
    relevant = {k: v for k, v in values.items() if k not in IGNORED_SETTINGS}
    relevant["store"] = str(Path(settings.store).expanduser().resolve())
    for name in PATH_SETTINGS:  # the files as they are now: one rewritten since the server started is another
        value = values.get(name)
        if isinstance(value, str) and value:
            relevant[f"_{name}_files"] = _files_state(_expanded(value))
    relevant["_version"], relevant["_protocol"], relevant["_code"] = __version__, PROTOCOL, code_hash()
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """A hash of the research_agent package's .py files (names and contents), once per process: ~8 ms for 108
    files (1.2 MB) on a warm cache. Contents, not mtimes: two installs of the same code agree. A server hashes
    when it starts listening, so a checkout under a running server changes the CLI's hash, not the server's: that
    server is then not asked."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder) / name
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                try:
                    digest.update(path.read_bytes())
                except OSError:
                    digest.update(b"unreadable")
    return digest.hexdigest()


def usable(settings: Settings) -> str | None:
    """Why the local socket is not used with these settings, or None."""
    if settings.local_server == "off":
        return "RESEARCH_AGENT_LOCAL_SERVER is off"
    if settings.server_mode:
        return "the store is a Chroma server"
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_PEERCRED"):
        return "the local socket needs Linux (SO_PEERCRED)"
    for name in PATH_SETTINGS:
        value = getattr(settings, name, None)
        if not value:
            continue
        path = _expanded(str(value))
        # A boosts file is always a path; a model name only when it names a folder here (else a hub name).
        if not path.is_absolute() and (name == "discovery_boosts_file" or _exists(path)):
            return (f"{name} is a relative path ({str(value)[:200]!r}): a server's working directory may hold "
                    "another file of that name")
    return None


def _expanded(value: str) -> Path:
    """`value` as a path with `~` expanded (as it was written when `~name` names no user: no such file then)."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        return Path(value)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long or unreadable is no folder of ours
        return False


def _files_state(path: Path) -> str:
    """What changes when a boosts file or model folder is rewritten: a file's size, times (ctime too: a copy with
    its mtime put back), inode and, for a small file, its contents; a folder's files' sizes, times and inodes. ""
    when the path is no file (a hub model name)."""
    try:
        if path.is_file():
            st = path.stat()
            head = path.read_bytes() if st.st_size <= 1 << 20 else b""
            return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{hashlib.sha256(head).hexdigest()}"
        if not path.is_dir():
            return ""
        parts: list[str] = []
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if len(parts) >= _STATE_FILES:
                    break
                st = (Path(folder) / name).stat()
                parts.append(f"{Path(folder, name).relative_to(path)}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:"
                             f"{st.st_ino}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.errno}"
