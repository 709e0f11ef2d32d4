"""A hit's label is the band of the score it shows, and its citation fields come from its metadata.

Regression (keyword engine change, issue 16): the label was computed from the unrounded probability, so a hit
shown as 0.5 (0.49996) was labelled "Somewhat Relevant" while the 0.5 band says "Relevant".
"""

from __future__ import annotations

from research_agent.search.retrieve import Candidate
from research_agent.search.service import _hits


def test_the_label_is_the_band_of_the_score_as_shown(container, fake_embedder):
    meta = {"source_document": "notes/a.md", "collection": "kb", "header_path": "A", "line_start": 3,
            "line_end": 9, "page": 2}
    hits, _, _ = _hits(container, "q", [Candidate("c1", "text", meta)], [0.49996], snippets=False, max_tokens=None)
    (hit,) = hits
    assert hit.relevance_score == 0.5 and hit.relevance_label == "Relevant"
    assert (hit.line_start, hit.line_end, hit.page, hit.path) == (3, 9, 2, None)  # no manifest: no file path
