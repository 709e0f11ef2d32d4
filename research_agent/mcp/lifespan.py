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
from research_agent.search.freshness import FreshnessWatcher

log = logging.getLogger("research_agent.mcp")

#: Seconds after `initialize` before the models warm up when the client never lists tools.
WARMUP_DELAY = 1.0
#: Tools (and manage_documents actions) that never embed or rerank: they wait only for the warm-up's store stage
#: (chromadb and numpy imported, ~1-2 s), not for the models (11-28 s measured in issue 15 for a first list,
#: status or validation error), even if they touch one. Every other call, resource and prompt also starts after
#: the store stage and waits for the models at its service's first use of one (Warmup.gate_models), so its
#: argument errors come back at once too (they waited 23.7 s behind a 20 s model load).
MODEL_FREE_TOOLS = frozenset({"manage_collections", "manage_projects", "get_status", "check_store",
                              "list_knowledge_bases", "retrieve_knowledge", "get_dependencies"})
MODEL_FREE_DOCUMENT_ACTIONS = frozenset({"list", "get", "remove", "prune"})
#: The longest /health waits for the warm-up's store stage before checking the store itself.
HEALTH_STORE_WAIT = 30.0
#: The longest /health's store check waits for a connect another thread has under way (docs/mcp.md promises an
#: answer within ~30 s, "degraded" when the store does not answer; a connect itself is bounded by the setting
#: chroma_connect_timeout, 5 s by default).
HEALTH_CHECK_WAIT = 10.0
#: How often a call waiting for the warm-up looks at it (seconds). Waiting polls instead of blocking a worker
#: thread: 45 calls blocked in threads took every one of anyio's 40, and a list queued behind them got -32005.
WARMUP_POLL = 0.05

#: Whether the call running in this context may need a model; set per tool call by LifecycleMiddleware.
NEEDS_MODELS: ContextVar[bool] = ContextVar("research_agent_needs_models", default=True)
#: Set by the call policy (calls.py) for a call's first run while the models still load: its first use of a
#: model raises ModelsNotReady instead of blocking the worker thread and the call's concurrency slot.
DEFER_MODELS: ContextVar[bool] = ContextVar("research_agent_defer_models", default=False)
#: Set by the call policy (calls.py) to a one-item list per call: True while the call's own thread loads the
#: embedding model (the warm-up was off, failed, or never ran), so a -32005 says the time went on that load
#: instead of telling the caller to narrow a request that never got to run.
LOADING_MODEL: ContextVar[list[bool] | None] = ContextVar("research_agent_loading_model", default=None)
#: The warm-up's state when its models loaded but the store did not open at start (a Chroma server slow or down);
#: reported as "done" once the store has connected since (Warmup.state).
STORE_LATE = "models loaded; store unreachable at start"


class ModelsNotReady(BaseException):
    """A call asked for a model the warm-up is still loading. The call policy then waits for the warm-up
    (outside the concurrency limit) and runs the call again; everything before a service's first use of a model
    is checking arguments and reading, so the first run wrote nothing that matters twice. A BaseException so a
    service's `except Exception` (one file's failure in an ingest, a reranker reported as unavailable) cannot take
    it for an ordinary error."""


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

    Calls wait for the store stage (chromadb and numpy imported) before they start (`until_store_ready`), and for
    the models only when their service first asks for one (`gate_models`): the loaders in embeddings.py and
    rerank.py take a lock and cache per process, so nothing loads twice anyway, but two threads importing
    numpy-based packages at the same moment can fail with "partially initialized module" ImportErrors.
    """

    def __init__(self, container: Container, enabled: bool) -> None:
        self.container = container
        self.enabled = enabled
        self._state = "pending" if enabled else "off"  # pending | running | done | failed | off | STORE_LATE
        self.error: str | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.thread: threading.Thread | None = None
        self._done = threading.Event()
        self._store_ready = threading.Event()
        if not enabled:
            self._done.set()
            self._store_ready.set()

    @property
    def state(self) -> str:
        """What get_status shows; STORE_LATE turns "done" once a later call has connected to the store."""
        if self._state == STORE_LATE and self.container.store.connected:
            return "done"
        return self._state

    @property
    def store_ready(self) -> bool:
        return self._store_ready.is_set()

    @property
    def models_ready(self) -> bool:
        return self._done.is_set()

    async def until(self, ready: threading.Event) -> None:
        """Wait (in the event loop, no worker thread held) until `ready` is set; starts a pending warm-up."""
        if not ready.is_set():
            self.start()
        while not ready.is_set():
            await anyio.sleep(WARMUP_POLL)

    async def until_store_ready(self) -> None:
        await self.until(self._store_ready)

    async def until_models_ready(self) -> None:
        await self.until(self._done)

    def gate_models(self) -> None:
        """Called on every use of a model through the served container: the warm-up thread itself and calls
        that need no model pass; a call's deferred first run raises ModelsNotReady; any other thread (a call's
        second run, a helper pool) blocks until the warm-up is done, as every model call did before."""
        if self._done.is_set() or threading.current_thread() is self.thread or not NEEDS_MODELS.get():
            return
        if DEFER_MODELS.get():
            raise ModelsNotReady
        self.start()
        self._done.wait()

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
        """The store stage, then the models whatever the store did: the models never need the store, and a
        Chroma server slow or down at start once left them unloaded, so the first query loaded the model inside
        its own time budget and timed out (-32005) while get_status said "failed" for ever."""
        self._state = "running"
        store_error = self._open_store()
        try:
            self.container.embedder  # noqa: B018 - loading is the point
            if self.container.settings.rerank:
                self.container.reranker.load()  # an unavailable reranker is reported by status and queries
            self._state, self.error = ("done", None) if store_error is None else (STORE_LATE, store_error)
            log.info("warm-up done: embedding model %s", self.container.settings.embedding_model)
        except Exception as exc:  # the tool that needs the model reports the error properly
            self._state, self.error = "failed", str(exc)
            log.warning("warm-up failed: %s", exc)
        finally:
            self._store_ready.set()
            self._done.set()

    def _open_store(self) -> str | None:
        """Import chromadb and numpy and connect; what went wrong, or None. A store that cannot open is reported
        by the call that uses it; calls start once this returns (`until_store_ready`)."""
        try:
            self.container.store.client  # noqa: B018 - chromadb and numpy imports first
            return None
        except Exception as exc:
            log.warning("warm-up: store not open at start (%s); loading the models anyway", exc)
            return str(exc)
        finally:
            self._store_ready.set()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


class ServedContainer(Container):
    """The server's container: its models pass the warm-up's gate first (Warmup.gate_models), so a call asks for
    the warm-up only when its service really touches a model, after its argument checks ran."""

    warmup: Warmup | None = None

    @classmethod
    def adopt(cls, container: Container) -> ServedContainer:
        """The same container (settings, store, locks) seen through the gate."""
        container.store  # noqa: B018 - built once here, so both views share one Store (and one Chroma client)
        served = cls.__new__(cls)
        served.__dict__.update(container.__dict__)
        return served

    def _gate(self) -> None:
        if self.warmup is not None:
            self.warmup.gate_models()

    @property
    def embedder(self) -> Any:
        self._gate()
        loading = LOADING_MODEL.get()
        if loading is None or self.embedder_loaded:
            return super().embedder
        loading[0] = True  # stays True if the call times out while this thread loads
        embedder = super().embedder
        loading[0] = False
        return embedder

    @property
    def reranker(self) -> Any:
        self._gate()
        return super().reranker


class ServerState:
    """Built by the lifespan, once per server run: container, limits, warm-up, running jobs, history writer."""

    def __init__(self, container: Container) -> None:
        s = container.settings
        self.container = served = ServedContainer.adopt(container)
        self.limiter = anyio.CapacityLimiter(max(1, int(s.max_concurrent_calls)))
        self.call_timeout = float(s.call_timeout)
        self.warmup = served.warmup = Warmup(served, bool(s.warmup))
        self.jobs: dict[str, dict[str, Any]] = {}
        self._history = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-history")
        self._last_history: Future[Any] | None = None
        # Another process's commit is caught up on notice, not by the next query (search/freshness.py).
        self.freshness = FreshnessWatcher(served)
        self.freshness.start()

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
        self.freshness.stop()
        self.warmup.cancel()
        self._history.shutdown(wait=True)
        self.container.close()


def store_health(c: Container) -> tuple[bool, str | None]:
    """Whether the store answers a heartbeat; a connect still under way after HEALTH_CHECK_WAIT is "no"."""
    try:
        c.store.client_within(HEALTH_CHECK_WAIT / 2)  # the rest of the budget is for the heartbeat itself
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
        """Mark whether this call may need a model: a model-free call never waits for the models, even when its
        service touches one (Warmup.gate_models)."""
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
