"""The MCP tools, one module per group (search, collections, projects, documents, discovery, operations),
each with `register(mcp)`; server.py registers them all. Importing this package imports nothing."""
