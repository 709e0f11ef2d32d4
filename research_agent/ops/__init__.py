"""Operations: what research-agent runs on, and the repairs after an interrupted write.

- status.py  store, models and counts (the `status` command and tool)
- doctor.py  find and repair what an interrupted write left behind (intents, swap copies, orphans)
- backup.py  export and import of a collection as JSONL (`export` / `import`, manage_collections)

Nothing is imported here: `status` must stay light (it answers before any model loads).
"""
