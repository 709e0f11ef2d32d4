"""A folder ingest holds a bounded amount of the folder in memory, whatever the folder's size (issue 16).

The overlapped pipeline (ingest/service.py: a reading thread, an embedding thread, commits in the calling thread)
may read ahead of the commits by READ_AHEAD_BATCHES batches and embed ahead by ENCODED_AHEAD. These tests count
the batches and prepared documents alive at once while the commits are the slow stage (so an unbounded reader
would race ahead through the whole folder; with both bounds set to 1,000 the small folder had 39 batches alive at
once, against 6), with no timing assertion: peak RSS of the real model on a real folder
is measured by benchmarks/ingest.py --rss-files (the counts here are what keeps it flat).

Real embedded Chroma; the fake embedder, since what is counted is the pipeline's, not the model's (the model's
memory is per slice of EMBED_SLICE_CHUNKS chunks, the same for any folder).
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from research_agent import ingest
from research_agent.catalog import collections
from research_agent.ingest import service
from test_concurrency import make_folder

#: Batches alive at once: READ_AHEAD_BATCHES queued, one the reader is handing over, one the encoder holds while it
#: waits for room, ENCODED_AHEAD embedded or being embedded ahead of their commit, and the one the calling thread
#: has just committed (its last reference until the next event): 6 with the defaults, for any folder.
BATCHES_BOUND = service.READ_AHEAD_BATCHES + service.ENCODED_AHEAD + 3


class _Live:
    """How many objects of one kind are alive now, and the most at once (refcounting frees them at once)."""

    def __init__(self) -> None:
        self.now = self.most = self.made = 0
        self._lock = threading.Lock()

    def track(self, obj: Any) -> Any:
        with self._lock:
            self.now += 1
            self.made += 1
            self.most = max(self.most, self.now)
        weakref.finalize(obj, self._gone)
        return obj

    def _gone(self) -> None:
        with self._lock:
            self.now -= 1


def _ingest_counting(c: Any, folder: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Live, _Live]:
    """Ingest `folder` with slow commits, counting the live batches and prepared documents."""
    batches, docs = _Live(), _Live()

    class CountedBatch(service._Batch):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            batches.track(self)

    prepare, commit = service.prepare_file, service.commit_versions

    def counted_prepare(*args: Any, **kw: Any) -> Any:
        return docs.track(prepare(*args, **kw))

    def slow_commit(*args: Any, **kw: Any) -> int:
        time.sleep(0.02)  # the commit is the slow stage: an unbounded reader would read the whole folder ahead
        return commit(*args, **kw)

    monkeypatch.setattr(service, "_Batch", CountedBatch)
    monkeypatch.setattr(service, "prepare_file", counted_prepare)
    monkeypatch.setattr(service, "commit_versions", slow_commit)
    collections.create_collection(c, name)
    report = ingest.ingest_path(c, folder, name)
    return report, batches, docs


@pytest.mark.slow  # ~10 s quiet, 80 s at load 13 (two folders through real Chroma)
def test_a_folder_ingest_holds_a_bounded_number_of_batches_whatever_the_folders_size(container, fake_embedder,
                                                                                     tmp_path, monkeypatch):
    monkeypatch.setattr(service, "EMBED_BATCH_CHUNKS", 4)  # many batches from a small folder
    small = make_folder(tmp_path / "small", 20, sections=2, words=20, seed=5, tag="small")
    large = make_folder(tmp_path / "large", 80, sections=2, words=20, seed=5, tag="large")
    runs = {n: _ingest_counting(container, f, n, monkeypatch) for n, f in (("small", small), ("large", large))}

    for name, files in (("small", 20), ("large", 80)):
        report, batches, docs = runs[name]
        assert report.added == files and not report.failed and not report.skipped
        assert batches.made >= files // 2 and batches.now == 0 and docs.now == 0, name
        assert batches.most <= BATCHES_BOUND, (name, batches.most)
        # A batch closes once it reaches EMBED_BATCH_CHUNKS chunks, so it holds at most that many documents.
        assert docs.most <= (BATCHES_BOUND + 1) * service.EMBED_BATCH_CHUNKS, (name, docs.most)
    # Four times the folder, not more held: the most alive at once does not grow with the folder.
    assert runs["large"][1].most <= BATCHES_BOUND and runs["large"][1].made >= 4 * BATCHES_BOUND
