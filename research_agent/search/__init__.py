"""Search: the query service and everything it ranks with. Import the submodules, not this package.

- service.py        query_knowledge and its result models (QueryResult, QueryHit), argument checks, the
                    collection scope, rerank blending and the token budget
- filters.py        metadata filters: validation, the Chroma `where` clause, the keyword-side predicate
- retrieve.py       candidates from the dense and keyword sides, convex / RRF fusion, the per-document cap
- diversity.py      the opt-in diversity pass: sections first under the per-document cap, then MMR within
                    sections
- refine.py         refinement advice (optimal / too_broad / clarification_needed) and suggested queries
- keyword_index.py  the BM25 index per collection (tantivy on our tokens): build, apply per document, rank
- keyword_sync.py   keeps it current: saved with the store, caught up from the change log (or a manifest diff)
- calibration.py    calibrated relevance probabilities and labels (parameters in calibration.json, shipped here)
- evaluation.py     nDCG / Recall / MRR on BEIR-format judgments (`research-agent eval`)
- history.py        recent queries, kept bounded in the store registry
- freshness.py      a long-lived server's watcher: catches up on another process's commit
- local_server.py   the local query socket: a CLI query answered by a running server (protocol, CLI side)

Tokens, stop words, the stemmer and snippets are research_agent.text's. Nothing is imported here, so
`from research_agent.search import history` loads no more than it needs.
"""
