"""MCP prompts: task preparation and knowledge audit (texts in research_agent/discovery), query refinement
and context extraction (texts here)."""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context, FastMCP
from pydantic import Field

from research_agent.mcp.calls import Calls, container


async def task_preparation(task: Annotated[str, Field(description="The task to prepare for.")]) -> str:
    from research_agent.discovery import task_preparation_prompt

    return task_preparation_prompt(task)


async def knowledge_audit(
    task: Annotated[str, Field(description="The task.")],
    loaded_context: Annotated[str, Field(description="Knowledge node ids already loaded, comma-separated.")],
) -> str:
    from research_agent.discovery import knowledge_audit_prompt

    return knowledge_audit_prompt(task, [p.strip() for p in loaded_context.split(",") if p.strip()])


async def query_refinement(
    query: Annotated[str, Field(description="The question or search to improve.")],
    ctx: Context,
) -> str:
    names = ""
    try:
        from research_agent.catalog.collections import list_collections

        listed = await Calls("prompt query_refinement").read(ctx, list_collections, container(ctx))
        names = "\n".join(f"- {c['name']} ({c['type']}): {c['description'] or 'no description'}"
                          for c in listed["collections"])
    except Exception:  # the prompt still helps without the list
        pass
    return (
        f"Help me search the research-agent knowledge base for:\n\n> {query}\n\n"
        + (f"Collections available:\n{names}\n\n" if names else "")
        + "1. Name the concrete concepts, identifiers and error strings in the question; drop filler words.\n"
        "2. Write two or three focused queries: one in natural language (mode=hybrid), and one with exact "
        "names or strings (mode=keyword) if there are any.\n"
        "3. Pick the collections (or project) that fit each query.\n"
        "4. Call query_knowledge_base for each. If a response's query_refinement.status is not \"optimal\", "
        "follow its suggestions and query again.\n"
        "5. Answer from the returned chunks only, citing source_document and header_path; say what was not "
        "found."
    )


async def context_extraction(
    document: Annotated[str, Field(description="The document's text (or a path or URL the model can read).")],
) -> str:
    return (
        "Extract the knowledge worth keeping from the document below, for a knowledge base that coding "
        "agents search.\n\n"
        "- Write Markdown with one `##` heading per topic, so each section stands alone when retrieved.\n"
        "- Keep facts, decisions and their reasons, APIs and signatures, configuration values, limits, error "
        "messages and their fixes; keep code blocks verbatim.\n"
        "- Drop greetings, repetition and speculation; mark anything uncertain as such.\n"
        "- End with a `Source:` line naming where it came from.\n\n"
        "Then save it with augment_knowledge(content=..., source=..., collection=...).\n\n"
        f"<document>\n{document}\n</document>"
    )


def register(mcp: FastMCP) -> None:
    mcp.prompt(name="task_preparation",
               description="Prepare context before executing a coding task.")(task_preparation)
    mcp.prompt(name="knowledge_audit",
               description="Verify sufficient context exists before proceeding.")(knowledge_audit)
    mcp.prompt(name="query_refinement",
               description="Turn a vague question into precise knowledge-base queries.")(query_refinement)
    mcp.prompt(name="context_extraction",
               description="Extract the facts worth keeping from a document, ready to save with augment_knowledge.",
               )(context_extraction)
