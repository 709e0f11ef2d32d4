"""The Typer CLI: one module per command group; every command parses, calls a service, renders."""
