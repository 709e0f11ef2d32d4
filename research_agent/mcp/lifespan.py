"""Per-run server state, built by the lifespan once per server run: the container, the call limits, the model
warm-up, the running jobs and the query-history writer; and the middleware that starts the warm-up after the
handshake, so torch never competes with it, and lets calls that need no model skip the model stage of it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

import anyio
from fastmcp.server.middleware import Middleware, MiddlewareContext

from research_agent.container import Container

log = logging.getLogger("research_agent.mcp")

#: Seconds after `initialize` before the models warm up when the client never lists tools.
WARMUP_DELAY = 1.0
#: Tools (and manage_documents actions) that never embed or rerank: they wait only for the warm-up's store stage
#: (chromadb and numpy imported, ~1-2 s), not for the models (11-28 s measured in issue 15 for a first list,
#: status or validation error). Every other call, resource and prompt waits for the whole warm-up as before.
MODEL_FREE_TOOLS = frozenset({"manage_collections", "manage_projects", "get_status", "check_store",
                              "list_knowledge_bases", "retrieve_knowledge", "get_dependencies"})
MODEL_FREE_DOCUMENT_ACTIONS = frozenset({"list", "get", "remove", "prune"})
#: The longest /health waits for the warm-up's store stage before checking the store itself.
HEALTH_STORE_WAIT = 30.0

#: Whether the call running in this context may need a model; set per tool call by LifecycleMiddleware.
NEEDS_MODELS: ContextVar[bool] = ContextVar("research_agent_needs_models", default=True)


def needs_models(tool: str, arguments: dict[str, Any] | None) -> bool:
    """Whether a tool call may embed or rerank (and so must wait for the models to warm up)."""
    if tool in MODEL_FREE_TOOLS:
        return False
    if tool == "manage_documents":  # before validation: `action` may be anything a client sent
        action = arguments.get("action") if isinstance(arguments, dict) else None
        return not (isinstance(action, str) and action in MODEL_FREE_DOCUMENT_ACTIONS)
    return True


class Warmup:
    """Loads the store client, then the embedding model and the reranker, once, in a background thread, after
    the handshake.

    Calls wait for a running warm-up before they start (`wait`): the loaders in embeddings.py and rerank.py take
    a lock and cache per process, so nothing loads twice anyway, but two threads importing numpy-based packages
    at the same moment can fail with "partially initialized module" ImportErrors. A call that needs no model
    (NEEDS_MODELS false in its context) waits only for the store stage: it imports nothing the model stage does.
    """

    def __init__(self, container: Container, enabled: bool) -> None:
        self.container = container
        self.enabled = enabled
        self.state = "pending" if enabled else "off"  # pending | running | done | failed | off
        self.error: str | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.thread: threading.Thread | None = None
        self._done = threading.Event()
        self._store_ready = threading.Event()
        if not enabled:
            self._done.set()
            self._store_ready.set()

    def _stage(self) -> threading.Event:
        return self._done if NEEDS_MODELS.get() else self._store_ready

    @property
    def finished(self) -> bool:
        """Whether the call in this context may start: the whole warm-up, or its store stage for a call that
        needs no model."""
        return self._stage().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until `finished` (start the warm-up now if its timer has not fired yet); False on timeout."""
        stage = self._stage()
        if not stage.is_set():
            self.start()
            return stage.wait(timeout)
        return True

    def schedule(self, delay: float) -> None:
        with self._lock:
            if self.enabled and self.thread is None and self._timer is None:
                self._timer = threading.Timer(delay, self.start)
                self._timer.daemon = True
                self._timer.start()

    def start(self) -> None:
        with self._lock:
            if not self.enabled or self.thread is not None:
                return
            self.thread = threading.Thread(target=self._run, name="model-warmup", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        self.state = "running"
        try:
            try:
                self.container.store.client  # noqa: B018 - chromadb and numpy imports first
            finally:
                self._store_ready.set()  # a store that cannot open is reported by the call that uses it
            self.container.embedder  # noqa: B018 - loading is the point
            if self.container.settings.rerank:
                self.container.reranker.load()  # an unavailable reranker is reported by status and queries
            self.state = "done"
            log.info("warm-up done: embedding model %s", self.container.settings.embedding_model)
        except Exception as exc:  # the tool that needs the model reports the error properly
            self.state, self.error = "failed", str(exc)
            log.warning("warm-up failed: %s", exc)
        finally:
            self._store_ready.set()
            self._done.set()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


class ServerState:
    """Built by the lifespan, once per server run: container, limits, warm-up, running jobs, history writer."""

    def __init__(self, container: Container) -> None:
        s = container.settings
        self.container = container
        self.limiter = anyio.CapacityLimiter(max(1, int(s.max_concurrent_calls)))
        self.call_timeout = float(s.call_timeout)
        self.warmup = Warmup(container, bool(s.warmup))
        self.jobs: dict[str, dict[str, Any]] = {}
        self._history = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-history")
        self._last_history: Future[Any] | None = None

    def record_query(self, result: dict[str, Any]) -> None:
        """Append to the query history off the response path (it takes the store's write lock)."""
        from research_agent.search.history import record_query

        def write() -> None:
            try:
                with self.container.store.session():
                    record_query(self.container, result.get("query", ""), result.get("collections"),
                                 len(result.get("results", [])), mode=result.get("mode"))
            except Exception as exc:
                log.debug("query history not recorded: %s", exc)

        self._last_history = self._history.submit(write)

    def flush_history(self, timeout: float = 30.0) -> None:
        if self._last_history is not None:
            try:
                self._last_history.result(timeout=timeout)
            except Exception:
                pass

    def close(self) -> None:
        self.warmup.cancel()
        self._history.shutdown(wait=True)
        self.container.close()


def store_health(c: Container) -> tuple[bool, str | None]:
    try:
        with c.store.session():
            c.store.client.heartbeat()
        return True, None
    except Exception as exc:
        from research_agent.errors import as_research_agent_error

        return False, as_research_agent_error(exc).type_name


class LifecycleMiddleware(Middleware):
    """Starts the model warm-up once the handshake is done, so torch never competes with it."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = holder

    async def on_initialize(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        result = await call_next(context)
        if self.holder.get("state") is not None:
            self.holder["state"].warmup.schedule(WARMUP_DELAY)
        return result

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        """Mark whether this call may need a model; the call policies (calls.py) wait for the warm-up stage
        `Warmup.finished` names in this context."""
        message = context.message
        token = NEEDS_MODELS.set(needs_models(getattr(message, "name", ""), getattr(message, "arguments", None)))
        try:
            return await call_next(context)
        finally:
            NEEDS_MODELS.reset(token)

    async def on_list_tools(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        result = await call_next(context)
        if self.holder.get("state") is not None:
            self.holder["state"].warmup.start()
        return result
