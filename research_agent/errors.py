"""The error hierarchy: one place that knows JSON-RPC codes and exit codes (DESIGN.md section 4)."""

from __future__ import annotations

import errno
from typing import Any


class ResearchAgentError(Exception):
    """Base of every error a user may see; carries a JSON-RPC code, an exit code and guidance."""

    code: int = -32000
    exit_code: int = 1
    type_name: str = "SystemError"
    #: "try again" errors (store locked, server unreachable) as opposed to "never works".
    retryable: bool = False

    def __init__(self, message: str, *, guidance: str | None = None, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = {k: v for k, v in data.items() if v is not None}
        self.data["type"] = self.type_name
        self.data["guidance"] = guidance or self.default_guidance
        self.data["retryable"] = self.retryable

    default_guidance = "Run `research-agent status` and check the log for details."

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "type": self.type_name, "message": self.message, "data": self.data}


class ConfigError(ResearchAgentError):
    code = -32001
    exit_code = 3
    type_name = "ConfigError"
    default_guidance = "Check your settings (`research-agent status`, .env, RESEARCH_AGENT_* variables)."


class StoreUnavailableError(ConfigError):
    """The store cannot be reached or locked right now; trying again may work."""

    type_name = "StoreUnavailableError"
    retryable = True
    default_guidance = "Try again in a moment; for many writers use a Chroma server (--chroma-host)."


class CollectionError(ResearchAgentError):
    code = -32002
    exit_code = 4
    type_name = "CollectionError"
    default_guidance = "Run `research-agent collections list` to see the collections that exist."


class DocumentError(ResearchAgentError):
    code = -32003
    exit_code = 5
    type_name = "DocumentError"
    default_guidance = "Check the path and the file's format."


class QueryError(ResearchAgentError):
    code = -32004
    exit_code = 6
    type_name = "QueryError"
    default_guidance = "Rephrase the query or check its arguments."


#: errno values and SQLite messages (as chromadb passes them on) of a store that cannot be written for want of room:
#: the user can act on them (free space, raise `ulimit -f`), so they are coded, not "Unexpected failure".
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO})
_STORAGE_MESSAGES = ("database or disk is full", "disk i/o error", "no space left on device", "file too large",
                     "disk quota exceeded")


def storage_failure(exc: BaseException) -> StoreUnavailableError | None:
    """The coded error for a write the disk refused (full, quota, file size limit, I/O error), else None.

    Trigger: the seventh attack pass (`ulimit -f 1000` then an ingest; a store on a full tmpfs): exit 1 /
    -32000 "Unexpected failure (InternalError)". Matched on errno, or on the message for chromadb's errors
    (it wraps SQLite's "(code: 778) disk I/O error" and "database or disk is full" in its own classes)."""
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        cause = exc.strerror or str(exc)
    elif any(m in str(exc).lower() for m in _STORAGE_MESSAGES):
        cause = str(exc).rsplit(")", 1)[-1].strip() or str(exc)
    else:
        return None
    return StoreUnavailableError(
        f"The store could not be written: the disk refused ({cause[:200]})",
        guidance="Free space on the disk that holds the store (or raise a file size limit such as `ulimit -f`), "
                 "then retry: whatever the failed write left is undone by the next write.")


def as_research_agent_error(exc: BaseException) -> ResearchAgentError:
    """Our errors pass through; a disk that refused a write is coded (`storage_failure`); anything else becomes a
    sanitized system error."""
    if isinstance(exc, ResearchAgentError):
        return exc
    refused = storage_failure(exc)
    if refused is not None:
        return refused
    return ResearchAgentError(
        f"Unexpected failure ({type(exc).__name__}); details are in the log.",
        guidance="Re-run with -v for the log; report the issue if it persists.",
    )
