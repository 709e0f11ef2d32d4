"""kill -9 an ingest anywhere, run it again: the store ends exactly as after one uninterrupted run.

Real CLI subprocesses (the deterministic fake embedder registered in them, so a run writes ~2,000 chunks in
a few seconds and a kill lands in the middle of Chroma writes), real embedded Chroma, real SIGKILL.
`research-agent doctor --repair` is checked against injected damage of every kind it knows.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from test_concurrency import FAKE_MODEL, cli_argv, cli_env, make_folder, open_store, run_cli, snapshot

COLLECTION = "crashy"


def write_v1(folder: Path, files: int) -> None:
    make_folder(folder, files, sections=3, words=40, seed=100, tag="corpus")


def write_v2(folder: Path, files: int) -> dict[str, list[str]]:
    """Change a third of the files (marking their old text as gone), delete a tenth, add new ones."""
    rng = random.Random(7)
    removed_words: list[str] = []
    for i in range(0, files, 3):  # changed: one more section, old unique words replaced
        path = folder / f"doc{i:03d}.md"
        removed_words.append(f"uniqcorpusn{i}s1")
        text = path.read_text(encoding="utf-8").replace(f"uniqcorpusn{i}s1", f"fresh{i}word")
        path.write_text(text + f"\n## Added\n\n{' '.join(rng.choice(['new', 'text', 'here']) for _ in range(30))}\n",
                        encoding="utf-8")
    deleted = []
    for i in range(1, files, 10):
        (folder / f"doc{i:03d}.md").unlink()
        removed_words.append(f"uniqcorpusn{i}s2")
        deleted.append(f"corpus/doc{i:03d}.md")
    make_folder(folder / "extra", files // 5, sections=2, words=30, seed=200, tag="extra")
    return {"removed_words": removed_words, "deleted": deleted}


def comparable(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without what legitimately differs between stores (absolute paths of the test folder)."""
    manifests = {}
    for key, m in snap["manifests"].items():
        m = dict(m)
        if m.get("path"):
            m["path"] = m["path"].rsplit("/corpus/", 1)[-1]
        manifests[key] = m
    return {"ids": snap["ids"], "count": snap["count"], "manifests": manifests, "texts": snap["texts"]}


def ingest_argv(tmp: Path, folder: Path) -> list[str]:
    return cli_argv(tmp, "--json", "kb", "add-folder", folder, "--collection", COLLECTION, "--prune", fake=True)


def fresh_run(base: Path, scenario: str, files: int) -> dict[str, Any]:
    """The reference: the final folder ingested in one uninterrupted run into a fresh store."""
    folder = base / "corpus"
    write_v1(folder, files)
    if scenario == "update":
        write_v2(folder, files)
    env = cli_env(base / "store", fake=True)
    assert run_cli(base, "collections", "create", COLLECTION, fake=True, env=env).returncode == 0
    done = run_cli(
        base, "--json", "kb", "add-folder", folder, "--collection", COLLECTION, "--prune", fake=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    c = open_store(base / "store", embedding_model=FAKE_MODEL)
    try:
        return comparable(snapshot(c, COLLECTION))
    finally:
        c.close()


_REFERENCE: dict[str, dict[str, Any]] = {}
FILES = {"fresh": 500, "update": 300}


def _generation(store: Path) -> str | None:
    try:
        return (store / ".generation").read_text()
    except OSError:
        return None


def kill_during(argv: list[str], env: dict[str, str], cwd: Path, store: Path, point: tuple[str, Any]) -> str:
    """Run the ingest and SIGKILL it at `point`: ("time", seconds after start); ("commits", n + fraction): after
    the n-th committed write batch plus a fraction of a second; ("step", "<ingest function>:<n>[+]"): the process
    kills itself at exactly that write step (see FAKE_CLI in test_concurrency). Returns what happened."""
    kind, value = point
    if kind == "step":
        env = {**env, "RA_TEST_KILL_AT": value}
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    alive = True
    try:
        if kind == "time":
            time.sleep(value)
        elif kind == "commits":
            commits, delay = int(value), value - int(value)
            seen, last = 0, _generation(store)
            while seen < commits and proc.poll() is None and time.monotonic() - started < 120:
                now = _generation(store)
                if now != last:
                    seen, last = seen + 1, now
                time.sleep(0.005)
            time.sleep(delay)
        if kind != "step":
            alive = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=120)
    if kind == "step":
        assert proc.returncode == -signal.SIGKILL, f"the run never reached {value} (rc {proc.returncode})"
    return (
        f"killed after {time.monotonic() - started:.2f} s"
        if alive
        else f"finished before the kill (rc {proc.returncode})"
    )


POINTS = [
    pytest.param("fresh", ("time", 1.0), id="fresh-time-1.0s"),
    pytest.param("fresh", ("time", 2.5), id="fresh-time-2.5s"),
    pytest.param("fresh", ("commits", 1.0), id="fresh-after-first-commit"),
    pytest.param("fresh", ("step", "_ensure_dimension:2"), id="fresh-step-chunks-upserted-manifests-not"),
    pytest.param("update", ("step", "_write_intent:1+"), id="update-step-intent-written"),
    pytest.param("update", ("step", "_ensure_dimension:1"), id="update-step-new-chunks-upserted"),
    pytest.param("update", ("step", "delete_chunks:1"), id="update-step-manifests-flipped-old-chunks-kept"),
    pytest.param("update", ("step", "_clear_intent:1"), id="update-step-old-chunks-deleted-intent-kept"),
    pytest.param("update", ("step", "prune"), id="update-step-prune-manifests-deleted-chunks-kept"),
]


@pytest.mark.slow
@pytest.mark.parametrize("scenario,point", POINTS)
def test_kill_9_mid_ingest_then_rerun_equals_one_uninterrupted_run(tmp_path, tmp_path_factory, scenario, point,
                                                                 fake_embedder):
    files = FILES[scenario]
    if scenario not in _REFERENCE:
        _REFERENCE[scenario] = fresh_run(tmp_path_factory.mktemp(f"reference-{scenario}"), scenario, files)
    reference = _REFERENCE[scenario]

    store = tmp_path / "store"
    folder = tmp_path / "corpus"
    env = cli_env(store, fake=True)
    write_v1(folder, files)
    assert run_cli(tmp_path, "collections", "create", COLLECTION, fake=True, env=env).returncode == 0
    changes: dict[str, list[str]] = {"removed_words": [], "deleted": []}
    if scenario == "update":
        first = run_cli(tmp_path, "kb", "add-folder", folder, "--collection", COLLECTION, fake=True, env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        changes = write_v2(folder, files)

    what = kill_during(ingest_argv(tmp_path, folder), env, tmp_path, store, point)
    print(scenario, point, what)

    again = subprocess.run(ingest_argv(tmp_path, folder), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["failed"] == []

    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        snap = snapshot(c, COLLECTION)
        got = comparable(snap)
        lost, extra = reference["ids"] - got["ids"], got["ids"] - reference["ids"]
        assert not lost and not extra, f"{what}: lost {len(lost)}, extra {len(extra)}"
        assert got["count"] == len(got["ids"]) == snap["manifest_chunks"], "duplicated or miscounted chunks"
        assert got["manifests"] == reference["manifests"]
        assert got["texts"] == reference["texts"]
        assert not snap["intent"], "an interrupted-write intent was left behind"

        from research_agent.ops.doctor import run_doctor
        from research_agent.search.service import query_knowledge

        report = run_doctor(c)
        assert report.healthy, report
        # The keyword index holds exactly what Chroma holds: removed text is not found.
        for word in changes["removed_words"][:25]:
            hits = query_knowledge(c, word, collections=[COLLECTION], mode="keyword", rerank=False).results
            assert all(word not in h.content for h in hits), word
            assert all(h.source_document not in changes["deleted"] for h in hits)
        if scenario == "update":
            hits = query_knowledge(c, "fresh3word", collections=[COLLECTION], mode="keyword", rerank=False).results
            assert hits and hits[0].source_document == "corpus/doc003.md"
    finally:
        c.close()

    doctor = run_cli(tmp_path, "--json", "doctor", fake=True, env=env)
    assert doctor.returncode == 0 and json.loads(doctor.stdout)["healthy"] is True, doctor.stdout


# -- doctor --repair on injected damage -----------------------------------------------------------------

@pytest.mark.parametrize("incomplete", [False, True],
                         ids=["orphans-and-reindex-leftovers", "plus-an-incomplete-document"])
def test_doctor_repair_fixes_orphans_incomplete_documents_and_interrupted_reindex(tmp_path, fake_embedder,
                                                                                  incomplete):
    store = tmp_path / "store"
    env = cli_env(store, fake=True)
    keep = make_folder(tmp_path / "keep", 6, seed=1)
    swap = make_folder(tmp_path / "swap", 3, seed=2)
    for name, folder in (("keep-col", keep), ("swap-col", swap)):
        assert run_cli(tmp_path, "collections", "create", name, fake=True, env=env).returncode == 0
        assert run_cli(tmp_path, "kb", "add-folder", folder, "--collection", name, fake=True, env=env).returncode == 0

    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        col = c.store.get_collection("keep-col")
        assert col.count() == 12
        with c.store.write_lock():
            # Orphans: chunks of a version no manifest points at (what a killed write leaves).
            col.upsert(ids=["deadbeefdeadbeef-000000000000-00000", "deadbeefdeadbeef-000000000000-00001"],
                       embeddings=[[1.0] + [0.0] * 63] * 2, documents=["orphan zebracorn one", "orphan zebracorn two"],
                       metadatas=[{"source_document": "keep/gone.md", "content_hash": "0" * 64}] * 2)
            if incomplete:
                # An incomplete document: its manifest stands, one of its chunks is gone.
                victim = sorted(col.get(where={"source_document": "keep/doc004.md"})["ids"])[0]
                col.delete(ids=[victim])
            # An interrupted reindex: the temporary collection is left, and `swap-col` sits under its backup name.
            c.store.client.create_collection("research-agent-tmp-0badf00d", metadata={"hnsw:space": "cosine"},
                                             embedding_function=None)
            c.store.client.get_collection("swap-col", embedding_function=None).modify(
                name="research-agent-old-1234abcd-swap-col")
    finally:
        c.close()

    check = run_cli(tmp_path, "--json", "doctor", fake=True, env=env)
    assert check.returncode == 1, (check.returncode, check.stderr)
    found = json.loads(check.stdout)
    assert found["healthy"] is False
    by_name = {ch["collection"]: ch for ch in found["collections"]}
    assert by_name["keep-col"]["orphan_chunks"] == 2
    assert by_name["keep-col"]["incomplete_documents"] == (["keep/doc004.md"] if incomplete else [])
    assert any("research-agent-tmp-0badf00d" in x for x in found["leftovers"])
    assert any("research-agent-old-1234abcd-swap-col" in x for x in found["leftovers"])
    # A script reading --json learns what to do from the report itself (advice was [] while only the text
    # output said to repair).
    assert any("research-agent doctor --repair" in a for a in found["advice"]), found["advice"]

    repair = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
    assert repair.returncode == 0, repair.stderr
    assert json.loads(repair.stdout)["actions"]

    again = run_cli(tmp_path, "--json", "doctor", fake=True, env=env)
    assert again.returncode == 0, again.stdout
    healthy = json.loads(again.stdout)
    assert healthy["healthy"] is True and healthy["leftovers"] == []
    assert not any("doctor --repair" in a for a in healthy["advice"])
    assert {ch["collection"] for ch in healthy["collections"]} == {"keep-col", "swap-col"}

    # swap-col is back with its documents; the incomplete document is re-ingested by the next run.
    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        assert c.store.get_collection("swap-col").count() == 6
        from research_agent.search.service import query_knowledge

        hits = query_knowledge(c, "zebracorn", collections=["keep-col"], mode="keyword", rerank=False).results
        assert hits == []
    finally:
        c.close()
    rerun = run_cli(tmp_path, "--json", "kb", "add-folder", keep, "--collection", "keep-col", fake=True, env=env)
    assert rerun.returncode == 0
    assert json.loads(rerun.stdout)["added"] == (1 if incomplete else 0)
    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        assert c.store.get_collection("keep-col").count() == 12
    finally:
        c.close()
