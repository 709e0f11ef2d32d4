"""`python -m research_agent` runs the CLI; `main()` is meant as the console script's target too (`research-agent`).

`main()` first lets research_agent/cli/serve.py start the MCP front for a plain `research-agent serve` (what
every shipped client config runs) before typer and the CLI load: tools/list 0.03 s after spawn instead of 0.2 s
quiet, 1-1.6 s under load (benchmarks/handshake.py). Any other command line goes straight to the CLI.
"""

import sys

#: Exit status for Ctrl-C (128 + SIGINT), what a shell reports for a command it interrupted.
INTERRUPTED_EXIT = 130


def main() -> None:
    """The `research-agent` command. Ctrl-C while it loads (1-2 s under load, before typer's own handling is in
    place) exits with INTERRUPTED_EXIT and no traceback."""
    try:
        from research_agent.cli.serve import start_front

        start_front(sys.argv[1:])
        from research_agent.cli.main import app

        app(prog_name="research-agent")
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED_EXIT)
    except Exception as exc:
        if _interrupt_inside(exc):
            sys.exit(INTERRUPTED_EXIT)
        raise


def _interrupt_inside(exc: BaseException) -> bool:
    """Whether `exc` was raised because of a KeyboardInterrupt (its direct cause): Python 3.11 wraps one that lands
    in a class's `__set_name__` (a dataclass being defined while a module loads) in RuntimeError, which printed a
    traceback and exited 1 for a Ctrl-C."""
    return isinstance(exc.__cause__, KeyboardInterrupt)


if __name__ == "__main__":
    main()
