"""research-agent: a local-first knowledge base shared by coding agents and people."""

__version__ = "0.1.0"
