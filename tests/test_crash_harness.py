"""The crash-point harness: every mutating command, killed with SIGKILL at each of its write steps, then the
user's next move (re-running the command, or the next command), ends in the store an uninterrupted run leaves.

Commands: kb add-folder, kb add-folder --prune, kb prune, kb reindex, kb remove-document, collections delete,
kb update-note, kb add-research, doctor --repair. Each runs as the real CLI in a subprocess; the kill point
is named in RA_TEST_KILL_AT (the hook of test_concurrency.FAKE_CLI), so the process kills itself exactly
between two writes. Compared with the uninterrupted run: the Chroma collections present (working copies
and backups included), chunk ids and texts, manifests, project links, leftover intents, the results of a
few queries, and `doctor`'s verdict. The fake embedder keeps each run at about a second; one reindex case
uses the real packaged model end to end.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from test_concurrency import FAKE_MODEL, cli_argv, cli_env, make_folder, open_store, run_cli, snapshot

pytestmark = pytest.mark.slow

COLL = "harness"
QUERIES = ("uniqcorpusn3s1 alpha", "socket timeout retry", "uniqcorpusn4s0")
# Each write step of write_documents: intent recorded; new chunks in; dimension recorded; manifests
# flipped (old chunks still there); old chunks gone (intent still there); intent gone (revision not bumped).
WRITE_STEPS = ["_write_intent:1+", "_ensure_dimension:1", "_ensure_dimension:1+", "delete_chunks:1",
               "_clear_intent:1", "_clear_intent:1+"]
# Steps that change what a query sees or what a re-run must undo (the others fall between two of these).
KEY_STEPS = ["_ensure_dimension:1", "delete_chunks:1", "_clear_intent:1"]


@dataclass
class Scenario:
    setup: Callable[[Path, dict[str, str]], None]     # builds the store the command starts from
    command: Callable[[Path], list[str]]              # the CLI arguments
    points: list[str]                                 # its write steps (RA_TEST_KILL_AT values)
    follow: Callable[[Path, dict[str, str]], None]    # the user's next move after the kill
    collections: tuple[str, ...] = (COLL,)
    after: Callable[[Path, dict[str, str]], None] = lambda base, env: None  # run after both, then compared
    ok_codes: dict[int, str] = field(default_factory=dict)  # other exit codes the follow-up may give (why)


def cli(base: Path, env: dict[str, str], *args: Any, codes: tuple[int, ...] = (0,)) -> dict[str, Any] | None:
    out = run_cli(base, "--json", *args, fake=True, env=env)
    assert out.returncode in codes, (args, out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    if out.returncode:
        error = json.loads(out.stderr.strip().splitlines()[-1])["error"]
        assert "collections create" not in error["message"] + error["data"]["guidance"], error
        return None
    return json.loads(out.stdout) if out.stdout.strip() else None


def write_v2(folder: Path) -> None:
    """Change three files, delete two, add two: an update with stale versions and prunes."""
    for i in (0, 3, 6):
        path = folder / f"doc{i:03d}.md"
        path.write_text(path.read_text(encoding="utf-8").replace(f"uniqcorpusn{i}s1", f"fresh{i}word")
                        + "\n## Added\n\nnew text here\n", encoding="utf-8")
    for i in (1, 8):
        (folder / f"doc{i:03d}.md").unlink()
    make_folder(folder / "extra", 2, seed=50, tag="extra")


def _created(base: Path, env: dict[str, str]) -> None:
    make_folder(base / "corpus", 10, seed=100)
    cli(base, env, "collections", "create", COLL)


def _ingested(base: Path, env: dict[str, str]) -> None:
    _created(base, env)
    cli(base, env, "kb", "add-folder", base / "corpus", "--collection", COLL)


def _prune_setup(base: Path, env: dict[str, str]) -> None:
    _ingested(base, env)
    write_v2(base / "corpus")


def _moved(base: Path, env: dict[str, str]) -> None:
    """The ingested folder renamed: its documents' files are gone, for `kb prune`."""
    _ingested(base, env)
    (base / "corpus").rename(base / "corpus-moved")


def _linked(base: Path, env: dict[str, str]) -> None:
    _ingested(base, env)
    cli(base, env, "projects", "create", "proj")
    cli(base, env, "projects", "set-defaults", "proj", "--collections", COLL)


def _noted(base: Path, env: dict[str, str]) -> None:
    _ingested(base, env)
    note = cli(base, env, "kb", "add-note", "--collection", COLL, "--title", "Plan", "--content",
               "# Plan\n\nFirst draft of the uniqnoteold plan.\n")
    (base / "note-id").write_text(note["document"], encoding="utf-8")


def _damaged(base: Path, env: dict[str, str]) -> None:
    """Every kind of damage doctor repairs: orphans, an incomplete document, reindex leftovers of two kinds."""
    _ingested(base, env)
    make_folder(base / "second", 3, seed=7)
    cli(base, env, "collections", "create", "second")
    cli(base, env, "kb", "add-folder", base / "second", "--collection", "second")
    c = open_store(base / "store", embedding_model=FAKE_MODEL)
    try:
        with c.store.write_lock():
            col = c.store.client.get_collection(COLL, embedding_function=None)
            col.upsert(ids=["deadbeefdeadbeef-000000000000-00000"], embeddings=[[1.0] + [0.0] * 63],
                       documents=["orphan zebracorn"], metadatas=[{"source_document": "corpus/gone.md"}])
            victim = sorted(col.get(where={"source_document": "corpus/doc002.md"})["ids"])[0]
            col.delete(ids=[victim])
            stale = c.store.client.create_collection(f"research-agent-old-0000aaaa-{COLL}",
                                                     metadata=dict(col.metadata), embedding_function=None)
            stale.upsert(ids=["x-1"], embeddings=[[1.0] + [0.0] * 63], documents=["stale backup"])
            c.store.client.create_collection(f"research-agent-tmp-0000bbbb-{COLL}", metadata=dict(col.metadata),
                                             embedding_function=None)
            c.store.client.get_collection("second", embedding_function=None).modify(
                name="research-agent-old-0000cccc-second")
    finally:
        c.close()


def _rerun(argv: Callable[[Path], list[str]], codes: tuple[int, ...] = (0,)) -> Callable[[Path, dict[str, str]], None]:
    def follow(base: Path, env: dict[str, str]) -> None:
        cli(base, env, *argv(base), codes=codes)
    return follow


def _reindex_follow(base: Path, env: dict[str, str]) -> None:
    # The next command (a default-scope query) works at once; then the reindex is run again.
    cli(base, env, "query", "uniqcorpusn3s1", "--mode", "keyword", "--no-rerank")
    cli(base, env, "kb", "reindex", "--collection", COLL)


def _recreate(base: Path, env: dict[str, str]) -> None:
    cli(base, env, "collections", "create", COLL)
    report = cli(base, env, "kb", "add-folder", base / "corpus", "--collection", COLL)
    assert report["added"] == 10 and report["unchanged"] == 0, report


SCENARIOS: dict[str, Scenario] = {
    "add-folder": Scenario(_created, lambda b: ["kb", "add-folder", b / "corpus", "--collection", COLL],
                           ["_write_intent:1+", *KEY_STEPS, "_ensure_dimension:1+", "_clear_intent:1+"],
                           _rerun(lambda b: ["kb", "add-folder", b / "corpus", "--collection", COLL])),
    "add-folder-prune": Scenario(
        _prune_setup, lambda b: ["kb", "add-folder", b / "corpus", "--collection", COLL, "--prune"],
        [*KEY_STEPS, "_write_intent:2+", "delete_chunks:2", "_clear_intent:2+"],
        _rerun(lambda b: ["kb", "add-folder", b / "corpus", "--collection", COLL, "--prune"])),
    "reindex": Scenario(
        _ingested, lambda b: ["kb", "reindex", "--collection", COLL],
        ["storage.store.Store.create_swap_copy:1+", "storage.store.Store.rename_collection:1",
         "storage.store.Store.rename_collection:1+", "storage.store.Store.rename_collection:2+",
         "storage.store.Store.delete_collection:1+"],
        _reindex_follow),
    "remove-document": Scenario(
        _ingested, lambda b: ["kb", "remove-document", "corpus/doc004.md", "--collection", COLL],
        ["_write_intent:1+", "delete_chunks:1", "_clear_intent:1"],
        # Killed after the manifest went, the document is already gone: "not found" (exit 5) is the truth.
        _rerun(lambda b: ["kb", "remove-document", "corpus/doc004.md", "--collection", COLL], codes=(0, 5))),
    "prune": Scenario(
        _moved, lambda b: ["kb", "prune", "--collection", COLL],
        ["_write_intent:1+", "delete_chunks:1", "_clear_intent:1"],
        _rerun(lambda b: ["kb", "prune", "--collection", COLL])),
    "collections-delete": Scenario(
        _linked, lambda b: ["collections", "delete", COLL, "--yes"],
        ["storage.store.Store.delete_collection:1", "storage.store.Store.delete_collection:1+",
         "storage.store.Store.registry_delete_collection:1+"],
        _rerun(lambda b: ["collections", "delete", COLL, "--yes"]), after=_recreate),
    "update-note": Scenario(
        _noted, lambda b: ["kb", "update-note", (b / "note-id").read_text(), "--collection", COLL, "--content",
                           "# Plan\n\nSecond draft of the uniqnotenew plan.\n"],
        KEY_STEPS,
        _rerun(lambda b: ["kb", "update-note", (b / "note-id").read_text(), "--collection", COLL, "--content",
                          "# Plan\n\nSecond draft of the uniqnotenew plan.\n"])),
    "add-research": Scenario(
        _ingested, lambda b: ["kb", "add-research", "--collection", COLL, "--source", "https://example.org/r",
                              "--content", "# Finding\n\nThe uniqresearch cache expires after five minutes.\n"],
        ["_ensure_dimension:1", "delete_chunks:1"],
        _rerun(lambda b: ["kb", "add-research", "--collection", COLL, "--source", "https://example.org/r",
                          "--content", "# Finding\n\nThe uniqresearch cache expires after five minutes.\n"])),
    "doctor-repair": Scenario(
        _damaged, lambda b: ["doctor", "--repair"],
        ["storage.store.Store.rename_collection:1+", "storage.store.Store.delete_collection:1+",
         "storage.store.Store.delete_collection:2+", "delete_chunks:1+", "storage.store.Store.registry_delete:1+"],
        _rerun(lambda b: ["doctor", "--repair"]), collections=(COLL, "second")),
}
POINTS = [pytest.param(name, point, id=f"{name}@{point}") for name, sc in SCENARIOS.items() for point in sc.points]


def store_state(store: Path, collections: tuple[str, ...]) -> dict[str, Any]:
    """What a user can observe of the store, read without triggering any recovery."""
    from research_agent.ops.doctor import run_doctor
    from research_agent.search.service import query_knowledge

    c = open_store(store, embedding_model=FAKE_MODEL)
    try:
        raw = sorted(col.name for col in c.store.client.list_collections())
        out: dict[str, Any] = {"raw": raw, "intents": c.store.registry_find("intent"),
                               "projects": c.store.registry_find("project")}
        for name in collections:
            if name not in raw:
                out[name] = None
                continue
            snap = snapshot(c, name)
            assert snap["count"] == len(snap["ids"]) == snap["manifest_chunks"], name
            queries = [[(h.source_document, h.content) for h in
                        query_knowledge(c, q, collections=[name], mode=mode, rerank=False, top_k=5).results]
                       for q in QUERIES for mode in ("keyword", "semantic")]
            manifests = {k: {**m, "extra": {f: v for f, v in m.get("extra", {}).items() if f != "added_at"}}
                         for k, m in snap["manifests"].items()}  # (a timestamp of the write)
            out[name] = {"ids": snap["ids"], "texts": snap["texts"], "manifests": manifests,
                         "queries": queries}
        out["healthy"] = run_doctor(c).healthy
        return out
    finally:
        c.close()


_BASES: dict[str, tuple[Path, dict[str, Any]]] = {}


def base_and_reference(name: str, factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The starting store (built once per command) and the state one uninterrupted run leaves."""
    if name not in _BASES:
        sc = SCENARIOS[name]
        base = factory.mktemp(f"harness-{name}")
        sc.setup(base, cli_env(base / "store", fake=True))
        shutil.copytree(base / "store", base / "start")
        env = cli_env(base / "store", fake=True)
        cli(base, env, *sc.command(base))
        sc.after(base, env)
        _BASES[name] = (base, store_state(base / "store", sc.collections))
    return _BASES[name]


def kill_at(base: Path, env: dict[str, str], argv: list[str], point: str) -> None:
    proc = subprocess.run(cli_argv(base, "--json", *argv, fake=True), env={**env, "RA_TEST_KILL_AT": point},
                          cwd=base, capture_output=True, text=True, timeout=120)
    assert (
        proc.returncode == -signal.SIGKILL
    ), f"the run never reached {point} (rc {proc.returncode}): {proc.stderr[-1500:]}"


@pytest.mark.parametrize("name,point", POINTS)
def test_kill_at_every_write_step_then_the_next_move_equals_an_uninterrupted_run(tmp_path_factory, fake_embedder,
                                                                              name, point):
    sc = SCENARIOS[name]
    base, reference = base_and_reference(name, tmp_path_factory)
    assert reference["healthy"] and not reference["intents"]
    trial = base / f"trial-{point.replace(':', '-').replace('+', 'p')}"
    shutil.copytree(base / "start", trial)
    env = cli_env(trial, fake=True)
    kill_at(base, env, sc.command(base), point)
    sc.follow(base, env)
    sc.after(base, env)
    got = store_state(trial, sc.collections)
    for key in ("raw", "intents", "projects", *sc.collections):
        assert got[key] == reference[key], f"{name} killed at {point}: {key} differs"
    assert got["healthy"], f"{name} killed at {point}: doctor finds damage"


# -- the real model, end to end: a reindex from the fake model to the packaged MiniLM, killed mid-swap --------
@pytest.mark.parametrize("point", ["storage.store.Store.rename_collection:1+"])
def test_real_model_reindex_killed_mid_swap_recovers_to_the_uninterrupted_result(tmp_path, fake_embedder, point):
    fake_env = cli_env(tmp_path / "store", fake=True)
    _ingested(tmp_path, fake_env)
    shutil.copytree(tmp_path / "store", tmp_path / "ref")
    real = {k: v for k, v in fake_env.items() if k != "RESEARCH_AGENT_EMBEDDING_MODEL"}
    ref_env = {**real, "RESEARCH_AGENT_STORE": str(tmp_path / "ref")}
    cli(tmp_path, ref_env, "kb", "reindex", "--collection", COLL)

    kill_at(tmp_path, real, ["kb", "reindex", "--collection", COLL], point)
    # The next command finds the collection (restored from its backup, still on the old model), and says so.
    listed = run_cli(tmp_path, "--json", "kb", "add-folder", tmp_path / "corpus", "--collection", COLL, fake=True,
                     env=real)
    error = json.loads(listed.stderr.strip().splitlines()[-1])["error"]
    assert listed.returncode == 4 and "kb reindex" in error["data"]["guidance"], error
    cli(tmp_path, real, "kb", "reindex", "--collection", COLL)

    def observed(store: Path) -> dict[str, Any]:
        c = open_store(store)
        try:
            snap = snapshot(c, COLL)
            names = sorted(col.name for col in c.store.client.list_collections())
            meta = c.store.get_collection(COLL).metadata
            return {
                "names": names,
                "ids": snap["ids"],
                "manifests": snap["manifests"],
                "embeddings": snap["embeddings"],
                "model": meta["embedding_model"],
                "dim": meta["embedding_dimension"],
            }
        finally:
            c.close()

    got, want = observed(tmp_path / "store"), observed(tmp_path / "ref")
    assert got["names"] == want["names"] == [COLL, "research-agent-meta"]
    assert got["ids"] == want["ids"] and got["manifests"] == want["manifests"] and len(got["ids"]) == 20
    assert got["dim"] == want["dim"] == 384 and got["model"] == want["model"] != FAKE_MODEL
    for cid, vec in got["embeddings"].items():
        assert max(abs(float(a) - float(b)) for a, b in zip(vec, want["embeddings"][cid])) < 1e-4, cid
