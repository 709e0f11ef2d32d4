"""The research-agent MCP server's entry file, kept for client configs: the server is research_agent/mcp/.

Run it with `python mcp_server.py`, `python -m mcp_server` or `research-agent serve`; all three call `run()`.
This file lives in the checkout only: the package does not install it as a top-level module (that name belongs to
the PyPI package `mcp-server`), so an installed research-agent-kb is started with `research-agent serve`.
This file only does what must happen before anything else is imported (the sys.path filter, the early stdio
claim that answers `initialize` and the tool, prompt and resource lists while FastMCP loads) and re-exports the
entry points. Stdout belongs to JSON-RPC: nothing prints, logs go to stderr, and heavy libraries (torch,
chromadb) load after the handshake (a background warm-up) or on the first tool call that needs them.
See docs/mcp.md for tools, transports, auth, resources, prompts, limits and error codes.
"""

from __future__ import annotations

import _signal  # built in: nothing to load
import os as _os
import sys as _sys

# Ctrl-C from the first line on exits 130 quietly (a KeyboardInterrupt in the middle of the imports below printed a
# traceback): this handler (130 is research_agent.mcp.launch.INTERRUPTED_EXIT, not importable yet) until launch takes
# over with its own (`starting`), which the server hands to Python's default handler once it handles Ctrl-C itself
# (research_agent/mcp/launch.py). Never over an inherited SIG_IGN (nohup) or when imported as a module.
if __name__ == "__main__":
    _first_handler = None
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, lambda signum, frame: _os._exit(130))
        _first_handler = _signal.getsignal(_signal.SIGINT)

# Take the working directory ('' or its path) off sys.path unless this file lives there. `python -m
# mcp_server` and `python -c` put it first on sys.path, and editors start servers in the open workspace: a
# cloned repository's own `research_agent/` package would be imported instead of ours. This runs before
# anything else is imported (so it cannot live in research_agent; research_agent.mcp.stdio has the same for
# `research-agent serve`). A workspace `mcp_server.py` itself still wins under `python -m`, which is why the
# shipped configs run `python /abs/path/mcp_server.py` or `research-agent serve` (docs/mcp.md).
try:
    _cwd = _os.path.realpath(_os.getcwd())
except OSError:  # the working directory was deleted: '' then finds nothing
    _cwd = _os.path.dirname(_os.path.realpath(__file__))
if _cwd != _os.path.dirname(_os.path.realpath(__file__)):
    _sys.path[:] = [_p for _p in _sys.path if _p and _os.path.realpath(_p) != _cwd]

if __name__ == "__main__":  # answer `initialize` and the lists while the imports below load (mcp/stdio.py)
    from research_agent.mcp.launch import starting

    starting(replacing=_first_handler)
    from research_agent.mcp.stdio import start_early

    start_early()

from typing import Any

from research_agent.mcp.app import main, run
from research_agent.mcp.server import create_server

__all__ = ["create_server", "main", "run"]

_default_server: Any = None


def __getattr__(name: str) -> Any:
    """`mcp_server.mcp`: a server with settings read from the environment at start-up, for tests
    (`fastmcp.Client(mcp)`), `fastmcp run mcp_server.py:mcp` and the MCP inspector. Built on first use so
    `python mcp_server.py` does not register every tool twice."""
    global _default_server
    if name == "mcp":
        if _default_server is None:
            _default_server = create_server()
        return _default_server
    raise AttributeError(name)


if __name__ == "__main__":
    main()
