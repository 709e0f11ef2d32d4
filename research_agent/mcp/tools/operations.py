"""evaluate_retrieval, check_store and get_status: measuring, checking and describing the server and its
store (research_agent/search/evaluation.py, doctor.py, status.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, state
from research_agent.mcp.params import COUNT_BOUND, CollectionName
from research_agent.ops.doctor import DoctorReport
from research_agent.ops.status import StatusReport
from research_agent.search.evaluation import EvalReport

EVALUATE = Tool("Measure retrieval on your judgments (BEIR files under the allowed roots): nDCG@k, Recall@k, MRR@k "
                "and latency per mode. No call timeout.",
                title="Evaluate retrieval", returns=(EvalReport,), read_only=True, idempotent=True)


@EVALUATE
async def evaluate_retrieval(
    collection: CollectionName,
    queries_file: Annotated[str, Field(description="BEIR queries.jsonl (_id, text).")],
    qrels_file: Annotated[str, Field(description="BEIR qrels TSV (query-id, corpus-id, score).")],
    ctx: Context,
    k: Annotated[int, Field(description="Cut-off for every metric.", ge=1, json_schema_extra=COUNT_BOUND)] = 10,
    limit: Annotated[int | None, Field(description="Only the first N judged queries.", ge=1)] = None,
) -> ToolResult:
    from research_agent.ingest import check_allowed
    from research_agent.search.evaluation import evaluate

    c = container(ctx)

    def run_eval() -> Any:
        roots = c.settings.resolved_allowed_roots()
        files = [check_allowed(Path(f), roots) for f in (queries_file, qrels_file)]
        return evaluate(c, collection, *files, k=k, limit=limit)

    return EVALUATE.result(await EVALUATE.write(ctx, run_eval))


CHECK = Tool("Find what an interrupted write left in the store (orphan chunks, incomplete documents, reindex "
             "leftovers); repair=true fixes it.",
             title="Check the store", returns=(DoctorReport,), destructive=True, idempotent=True)


@CHECK
async def check_store(
    ctx: Context,
    repair: Annotated[bool, Field(description="Fix it (deletes orphan chunks).")] = False,
) -> ToolResult:
    from research_agent.ops.doctor import run_doctor

    return CHECK.result(await CHECK.write(ctx, run_doctor, container(ctx), repair=repair))


STATUS = Tool("Version, store (reachable?), models (loaded, available), counts, warm-up, limits and running "
              "ingestion jobs.",
              title="Status", returns=(StatusReport,), read_only=True, idempotent=True,
              extra={"running_jobs": {"type": "array"}, "warmup": {"type": "string"}, "limits": {"type": "object"}})


@STATUS
async def get_status(ctx: Context) -> ToolResult:
    from research_agent.ops.status import get_status as status

    server = state(ctx)
    data = await STATUS.read(ctx, status, server.container)
    now = time.time()
    data["running_jobs"] = [{**{k: v for k, v in job.items() if k != "started_at"},
                             "seconds": round(now - job["started_at"], 1)} for job in list(server.jobs.values())]
    data["warmup"] = server.warmup.state
    data["limits"] = {"max_concurrent_calls": int(server.container.settings.max_concurrent_calls),
                      "call_timeout": server.call_timeout}
    return STATUS.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, evaluate_retrieval, check_store, get_status)
