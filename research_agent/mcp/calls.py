"""How a tool's service call runs: one policy object per tool (`Tool`) or resource (`Calls`), three kinds.

- `read`: bounded by `call_timeout` (a timed-out thread finishes in the background, writing nothing).
- `write`: not bounded, since cutting a write off midway is worse than waiting for it.
- `job`: a long write (ingest, reindex): listed by get_status until the call ends (also while it waits for the
  warm-up), reports MCP progress that only increases across its runs, and stops at its next file when the
  client cancels the request.

All three run at once after the warm-up's store stage; a call whose service asks for a model while the warm-up
still loads it is run again once the models are there (`Calls._attempts`). Waiting for the warm-up counts
toward the time limit but holds no slot and no worker thread. Each run holds one of `max_concurrent_calls`
slots, runs the synchronous service in a worker thread inside a store session, and turns what it raised into a
ToolFailure that research_agent/mcp/errors.py maps to a JSON-RPC error.
`Tool` also carries the tool's registration data, so a tool's name is written once: its function's name.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import anyio
from fastmcp import Context, FastMCP
from fastmcp.tools import FunctionTool, ToolResult

from research_agent.container import Container
from research_agent.mcp.errors import CallCancelled, ToolFailure, call_timeout, invalid_params, to_tool_failure
from research_agent.mcp.lifespan import DEFER_MODELS, LOADING_MODEL, ModelsNotReady, ServerState
from research_agent.mcp.params import lean_input, result_schema
from research_agent.mcp.render import render

log = logging.getLogger("research_agent.mcp")

#: What an action of a combined tool does: "read" (timed, changes nothing), "write", or "delete".
Effect = Literal["read", "write", "delete"]


def state(ctx: Context) -> ServerState:
    return ctx.lifespan_context["state"]


def container(ctx: Context) -> Container:
    return state(ctx).container


def dump(result: Any) -> dict[str, Any]:
    return result.model_dump(mode="json") if hasattr(result, "model_dump") else result


def require(value: Any, name: str, action: str) -> Any:
    """An argument that the chosen action needs: missing, it is a -32602 naming the argument."""
    if value is None or value == "" or value == []:
        raise ToolFailure(invalid_params(f"{name} is required for action {action!r}", f"Call again with {name} set.",
                                         argument=name))
    return value


def _in_session(st: ServerState, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Worker-thread side of a tool call: the store may be shared by other calls, never reopened under them."""
    with st.container.store.session():
        return fn(*args, **kwargs)


class Calls:
    """The call policies for one tool, resource or prompt; `label` names it in time-out and error messages."""

    def __init__(self, label: str = "") -> None:
        self.label = label

    async def read(self, ctx: Context, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await self._run(ctx, fn, args, kwargs, timed=True)

    async def write(self, ctx: Context, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await self._run(ctx, fn, args, kwargs, timed=False)

    async def job(self, ctx: Context, job: dict[str, Any], fn: Callable[..., Any], *args: Any,
                  **kwargs: Any) -> dict[str, Any]:
        """`job` ({collection, path}) is what get_status lists while `fn(..., progress=...)` runs."""
        return await self._run(ctx, fn, args, kwargs, timed=False, job=job)

    async def _run(self, ctx: Context, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
                   timed: bool, job: dict[str, Any] | None = None) -> dict[str, Any]:
        st = state(ctx)
        limit = st.call_timeout if timed and st.call_timeout > 0 else math.inf
        warming = [False]  # whether the time is going on the warm-up (the -32005 message says so)
        loading = [False]  # whether this call's own thread is loading the embedding model (lifespan.py)
        listed = _Job(st, self.label, job) if job is not None else None
        token = LOADING_MODEL.set(loading)  # copied into the worker threads' contexts by anyio
        try:
            with anyio.move_on_after(limit) as scope:  # the warm-up wait counts toward the limit too
                result = await self._attempts(ctx, st, partial(fn, *args, **kwargs), timed, listed, warming)
            if scope.cancelled_caught:
                raise ToolFailure(call_timeout(self.label, limit, warming_up=warming[0], loading_model=loading[0]))
        except (ToolFailure, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            raise to_tool_failure(exc, self.label) from exc
        finally:
            LOADING_MODEL.reset(token)
            if listed is not None:
                listed.end()
        return dump(result)

    async def _attempts(self, ctx: Context, st: ServerState, call: Callable[..., Any], timed: bool,
                        job: _Job | None, warming: list[bool]) -> Any:
        """The call, run at once (after the warm-up's store stage, ~1-2 s) and, if its service asked for a
        model the warm-up is still loading, once more when the models are there.

        Why: argument errors raised inside the services (an empty query, a path outside the allowed roots, an
        unknown collection) waited 20 s behind a model load they never needed. Both waits poll in the event loop,
        outside the concurrency limiter: a call waiting in a worker thread or holding a slot for a model load
        starved the model-free calls behind it (45 queued queries: a collection list got -32005 after 72 s).
        """
        warming[0] = True
        await st.warmup.until_store_ready()
        warming[0] = False
        try:
            return await self._once(ctx, st, call, timed, job, defer=not st.warmup.models_ready)
        except ModelsNotReady:
            log.debug("%s waits for the model warm-up", self.label)
            if job is not None:
                job.mark("waiting for models")  # still listed by get_status while it waits (it once vanished)
        warming[0] = True
        await st.warmup.until_models_ready()
        warming[0] = False
        return await self._once(ctx, st, call, timed, job, defer=False)

    async def _once(self, ctx: Context, st: ServerState, call: Callable[..., Any], timed: bool,
                    job: _Job | None, *, defer: bool) -> Any:
        """One run in a worker thread holding a concurrency slot; with `defer`, the service's first use of a
        model raises ModelsNotReady (lifespan.py Warmup.gate_models) instead of blocking the slot."""
        token = DEFER_MODELS.set(defer)  # copied into the worker thread's context by anyio
        try:
            async with st.limiter:  # waiting for a free slot counts toward the time limit
                if job is None:
                    return await anyio.to_thread.run_sync(partial(_in_session, st, call), abandon_on_cancel=timed)
                job.mark("running")
                return await _run_job(ctx, st, self.label, job, call)
        finally:
            DEFER_MODELS.reset(token)


class Tool(Calls):
    """A tool's description, annotations and output schema, and its call policies; decorating the tool's
    function names it.

    Descriptions are given here instead of docstrings: FastMCP parses docstrings with griffe, whose import
    alone adds ~0.2 s to the handshake. `returns` are the result models (one per kind of answer); the output
    schema is derived from them, so it cannot drift from what the service returns.

    MCP annotations are per tool, not per action, and the hints mean "may": a combined tool (`actions`) whose
    delete action deletes is destructive even though its list action is not. So the annotations describe the
    worst action and the description names what each action does ("Read-only: list, info. Writes: create.
    Deletes: delete."), generated from the same table the hints come from (basic-memory splits every action
    into its own tool instead; DESIGN.md fixes the combined tools).
    """

    def __init__(self, description: str, *, title: str, returns: tuple[type, ...], idempotent: bool,
                 read_only: bool = False, destructive: bool = False, actions: dict[str, Effect] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__()
        if actions:
            read_only = all(effect == "read" for effect in actions.values())
            destructive = any(effect == "delete" for effect in actions.values())
            description = f"{description} {action_effects(actions)}"
        self.description, self.title, self.actions = description, title, actions or {}
        self.annotations = {"readOnlyHint": read_only, "destructiveHint": destructive,
                            "idempotentHint": idempotent, "openWorldHint": False}
        self.output_schema = result_schema(*returns, extra=extra)
        self.fn: Callable[..., Any] | None = None

    async def act(self, ctx: Context, action: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one action of a combined tool with the policy its effect implies: reads are timed, writes not."""
        run = self.read if self.actions.get(action) == "read" else self.write
        return await run(ctx, fn, *args, **kwargs)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.fn, self.label = fn, fn.__name__
        fn.mcp_tool = self  # type: ignore[attr-defined]
        return fn

    def result(self, data: dict[str, Any]) -> ToolResult:
        """Structured content for agents plus a Markdown view for clients that only show text."""
        return ToolResult(content=render(self.label, data), structured_content=data)


def add_tools(mcp: FastMCP, *fns: Callable[..., Any]) -> None:
    """Register tool functions decorated with a `Tool`, in the order given (the order of tools/list)."""
    for fn in fns:
        spec: Tool = fn.mcp_tool  # type: ignore[attr-defined]
        tool = FunctionTool.from_function(fn, title=spec.title, description=spec.description,
                                          output_schema=spec.output_schema, annotations=spec.annotations)
        tool.parameters = lean_input(tool.parameters)
        mcp.add_tool(tool)


def action_effects(actions: dict[str, Effect]) -> str:
    """"Read-only: list, info. Writes: create. Deletes: delete." in the order the actions are declared."""
    labels = {"read": "Read-only", "write": "Writes", "delete": "Deletes"}
    parts = []
    for effect, label in labels.items():
        chosen = [name for name, e in actions.items() if e == effect]
        if chosen:
            parts.append(f"{label}: {', '.join(chosen)}.")
    return " ".join(parts)


class _Job:
    """One job call's entry in get_status and its last progress value, kept across the call's runs.

    Why: a job whose first run stopped at ModelsNotReady (the warm-up still loading) was dropped from get_status
    while it waited and, run again, restarted its progress notifications at 0 after 59/60 had been sent; MCP
    requires each notification's progress to increase within one request.
    """

    def __init__(self, st: ServerState, label: str, job: dict[str, Any]) -> None:
        self.st, self.id, self.sent = st, uuid.uuid4().hex[:12], -1.0
        st.jobs[self.id] = {"id": self.id, "tool": label, **job, "state": "starting", "started_at": time.time(),
                            "progress": None}

    def mark(self, job_state: str) -> None:
        if self.id in self.st.jobs:
            self.st.jobs[self.id]["state"] = job_state

    def record(self, report: Any) -> None:
        if self.id in self.st.jobs:
            self.st.jobs[self.id]["progress"] = dump(report)

    def end(self) -> None:
        self.st.jobs.pop(self.id, None)


class _Progress:
    """The worker side of a job's progress: records it for get_status and drops it into a stream."""

    def __init__(self, job: _Job, label: str, send: Any, cancelled: threading.Event) -> None:
        self.job, self.label, self.send, self.cancelled = job, label, send, cancelled

    def __call__(self, report: Any) -> None:
        if self.cancelled.is_set():
            raise CallCancelled(f"{self.label} cancelled by the client")
        self.job.record(report)
        try:
            anyio.from_thread.run_sync(self.send.send_nowait, report)
        except Exception:  # stream closed or loop gone: progress is best effort
            pass


def _progress_value(report: Any) -> float:
    """Files done, or while a batch is embedded files_progress (files done plus the share of the batch's chunks
    embedded, ingest/service.py IngestProgress): one large file once showed 0 until it was written."""
    return max(float(report.files_done), float(getattr(report, "files_progress", 0.0) or 0.0))


async def _forward(ctx: Context, receive: Any, cancelled: threading.Event, job: _Job) -> None:
    """Send the latest report as an MCP progress notification, coalescing bursts, so a slow client never
    slows ingestion down; on cancellation set `cancelled` so the worker stops at its next report. The last value
    sent is the job's (`job.sent`), not this run's: a run again after the warm-up sends only what is past it."""
    try:
        async with receive:
            async for report in receive:
                while True:
                    try:
                        report = receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                done, total = _progress_value(report), float(report.files_total or 0)
                if done <= job.sent:
                    continue  # MCP requires each notification's progress to increase
                job.sent = done
                note = (f"{report.stage}: {done:g}/{report.files_total} files, "
                        f"{report.chunks_done}/{report.chunks_total} chunks")
                if report.current:
                    note += f" ({report.current})"
                try:
                    await ctx.report_progress(done, total or None, note)
                except Exception:
                    log.debug("progress notification failed", exc_info=True)
    except anyio.get_cancelled_exc_class():
        cancelled.set()
        raise


async def _run_job(ctx: Context, st: ServerState, label: str, job: _Job, fn: Callable[..., Any]) -> Any:
    """One run of `fn(progress=...)` in a worker thread; its reports become MCP progress notifications. The
    job's get_status entry belongs to the whole call (`Calls._run`), not to this run.

    When the request is cancelled the worker raises CallCancelled at its next report: the batch being written
    finishes (each is atomic), nothing after it is written.
    """
    cancelled = threading.Event()
    send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=math.inf)
    progress = _Progress(job, label, send, cancelled)
    error: BaseException | None = None
    result: Any = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_forward, ctx, receive, cancelled, job)
        try:
            # Not abandoned on cancel: the request ends only when the worker has stopped writing.
            result = await anyio.to_thread.run_sync(partial(_in_session, st, fn, progress=progress))
        except (Exception, ModelsNotReady) as exc:  # raised after the task group, not inside it
            error = exc
        finally:
            send.close()
    if error is not None:
        raise error
    return result
