"""The catalog: what the store holds and how it is grouped. Import the submodules, not this package.

- common.py       `Deleted` and `now_iso`, shared so the import runs one way (collections -> projects)
- collections.py  create, list, inspect and delete collections (links to projects on create/delete)
- projects.py     named groups of linked collections, with default collections for queries
- notes.py        external research and notes stored with their source, title and provenance

Nothing is imported here, so `from research_agent.catalog import projects` loads no more than it needs.
"""
