"""What the global options put in ctx.obj, and the container built from them on first use."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer


@dataclass
class CliState:
    json: bool = False
    config_file: str | Path | None = None
    store: str | Path | None = None
    chroma_host: str | None = None
    chroma_port: int | None = None
    verbose: int = 0
    quiet: bool = False
    _container: Any = field(default=None, repr=False)

    @property
    def log_level(self) -> str | None:
        """-q: errors only; -v: INFO; -vv: DEBUG; neither: whatever the settings say."""
        if self.quiet:
            return "ERROR"
        if self.verbose:
            return "DEBUG" if self.verbose > 1 else "INFO"
        return None

    def overrides(self) -> dict[str, Any]:
        """The global flags as Settings overrides (None = not given, so lower layers decide)."""
        return {"store": self.store, "chroma_host": self.chroma_host, "chroma_port": self.chroma_port,
                "log_level": self.log_level}

    def container(self) -> Any:
        # Built on first use so `--help` and usage errors never load settings or the store.
        if self._container is None:
            from research_agent.container import build_container

            self._container = build_container(self.config_file, one_shot=True, **self.overrides())
            if self.json:
                json_logs()
        return self._container

    def read(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a read-only service call as the MCP server does: inside a store session, so a commit by
        another process never lands mid-read (without it, 1 in 10-40 reads failed during writes).
        Writers and long commands (ingest, watch) are not wrapped: a session held for minutes would
        hold other processes' commits back."""
        c = self.container()
        with c.store.session():
            return fn(c, *args, **kwargs)

    def served(self, op: str, **args: Any) -> Any:
        """`op`'s answer from a long-lived MCP server on the same store with the same settings (no chromadb, numpy
        or torch imported to ask), or None: run it in this process. A coded error the server's service raised is
        raised here as it was (research_agent/search/local_server.py)."""
        from research_agent.search import local_server

        return local_server.ask(self.container().settings, op, args)

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None


def served_result(data: Any, op: str) -> Any:
    """A local server's answer to `op` as this code's result model (QueryResult, DiscoveryResult), or None (logged
    at INFO) when it is not one: a server running other code (the fingerprint's code hash makes that rare) is
    then passed over, not shown."""
    from pydantic import ValidationError

    if op == "query":
        from research_agent.search.service import QueryResult as Model
    else:
        from research_agent.discovery.models import DiscoveryResult as Model
    try:
        return Model.model_validate(data)
    except ValidationError as exc:
        logging.getLogger("research_agent.local_server").info(
            "%s runs in this process: the local server's answer is not this version's result (%s)", op,
            str(exc).splitlines()[0][:200])
        return None


class Dumped:
    """A result already in its JSON shape (a local server's answer): what render.emit prints under --json, without
    importing the service module to rebuild its model."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return self.data


class JsonLogFormatter(logging.Formatter):
    """Under --json, a log record on stderr is one JSON line too (`{"log": {...}}`), beside the `{"error": ...}`
    line, so a script can parse all of stderr; a self-heal warning was plain text among them."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps({"log": entry})


def json_logs() -> None:
    """Switch the stderr log handler configure_logging installed to JSON lines (a log file keeps its format)."""
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setFormatter(JsonLogFormatter())


def get_state(ctx: typer.Context) -> CliState:
    """The root context's state (a default one when a command runs without the callback, e.g. in docs)."""
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def split_names(value: str | None) -> list[str] | None:
    """`a,b, c` -> ["a", "b", "c"]; None stays None."""
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]
