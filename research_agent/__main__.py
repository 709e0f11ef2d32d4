"""`python -m research_agent` runs the CLI."""

from research_agent.cli.main import app

app(prog_name="research-agent")
