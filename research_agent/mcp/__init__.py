"""The MCP face of research-agent: a FastMCP server over the same services as the CLI.

app.py (run, main) → server.py (create_server, the composition root) → tools/<group>.py, resources.py,
prompts.py, each with `register(mcp)`; calls.py (read/write/job call policies), lifespan.py (per-run state,
warm-up), errors.py (errors → JSON-RPC), auth.py (HTTP guards), render.py (Markdown views), params.py
(shared argument types). Importing this package imports nothing: mcp_server.py claims stdio first.
"""
