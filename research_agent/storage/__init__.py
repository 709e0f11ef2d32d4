"""Storage: the Chroma store at the bottom of the house. Only this package imports chromadb.

- store.py     the Store: one Chroma client per process (embedded or server), sessions, the write lock and
               read gate, collections (validated names, listing without reindex working copies)
- locks.py     the locking primitives: shared/exclusive use of the client in a process, the cross-process
               read gate (flock files) a writer closes only around its commit steps
- swaps.py     reindex swaps: working-copy and backup names, the rename protocol, recovery after a kill
- registry.py  our own records in the meta collection: every key format, get/find/put/delete, revisions
- writer.py    the crash-safe write protocol: intent, new chunks, manifest flip, old chunks out, revision
               bump; recovery of a dead writer's intent
- chunks.py    the one paging loop over a Chroma collection and the visibility rule (a chunk is visible
               only if its document's manifest names its content hash)

Nothing is imported here, so `from research_agent.storage import registry` loads no more than it needs.
"""
