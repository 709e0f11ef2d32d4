"""Lease and claim records that are malformed or hostile (attack pass H1b on storage/leases.py).

Findings: forged records (`renewed` null / "yesterday" / NaN, `started` 1e20, not JSON, pid 2**70 ...) crashed
doctor, every reindex and the write check of their collection; a reindex that failed inside its election left its
claim (its own server then refused its next reindex for 120 s); two reindexes both won when their clocks differed
by 350 s; a forged host drove the terminal through doctor's notes; smaller quoting faults. A real `chroma run`
server (tests/conftest.py `chroma_server`); the embedder is the fake one, as in the other lease tests (the model
plays no part in the lease).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from test_concurrency import run_cli
from test_lease_claims import FOREIGN, _claim, _claims
from test_server_writes import _open, _seed, _server_env, _unique

NOW = 1_800_000_000.0
GOOD = {**FOREIGN, "started": NOW, "renewed": NOW, "token": "t" * 32}

#: Records no holder writes: each must parse as malformed (None), and no lease function may raise on it.
MALFORMED = {
    "renewed null": {**GOOD, "renewed": None},
    "renewed text": {**GOOD, "renewed": "yesterday"},
    "renewed numeric text": {**GOOD, "renewed": str(NOW)},
    "renewed list": {**GOOD, "renewed": [1]},
    "renewed NaN": '{"host": "h", "pid": 1, "renewed": NaN}',
    "renewed Infinity": '{"host": "h", "pid": 1, "renewed": Infinity}',
    "renewed 1e308": {**GOOD, "renewed": 1e308},
    "renewed missing": {k: v for k, v in GOOD.items() if k != "renewed"},
    "renewed true": {**GOOD, "renewed": True},
    "started text": {**GOOD, "started": "abc"},
    "started 1e20": {**GOOD, "started": 1e20},
    "pid text": {**GOOD, "pid": "abc"},
    "pid float": {**GOOD, "pid": 1.5},
    "pid true": {**GOOD, "pid": True},
    "pid 2**70": {**GOOD, "pid": 2**70},
    "pid negative": {**GOOD, "pid": -1},
    "host int": {**GOOD, "host": 5},
    "host huge": {**GOOD, "host": "h" * 10_000},
    "pidns int": {**GOOD, "pidns": 3},
    "token list": {**GOOD, "token": ["x"]},
    "a list": [1, 2],
    "null": None,
    "a number": 5,
    "not JSON": "{not json",
    # a host that drives a terminal or forges a line where doctor and refusals show it (attack pass, round 2)
    "host newline": {**GOOD, "host": "vm\nstore: healthy"},
    "host tab": {**GOOD, "host": "vm\tx"},
    "host escape": {**GOOD, "host": "vm\x1b[2J"},
    "host line separator": {**GOOD, "host": "vm\u2028x"},
    "host right-to-left mark": {**GOOD, "host": "vm\u200fx"},
    "pidns newline": {**GOOD, "pidns": "pid:[1]\nx"},
}


def _here(**extra):
    from research_agent.storage.leases import holder

    return {**GOOD, **holder(), **extra}


# -- pure logic --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_record_parses_as_none_and_counts_for_nothing(name):
    """Every lease function takes a malformed record for what it is: not live for writes or elections, removable
    as a claim, blocking 0 s, its holder never called gone; none raises (old code: TypeError, ValueError,
    AttributeError, OverflowError from os.kill(2**70))."""
    from research_agent.storage import leases

    raw = MALFORMED[name]
    assert leases.parse_record(raw if isinstance(raw, str) else json.dumps(raw)) is None
    if not isinstance(raw, str):
        assert leases.parse_record(raw) is None
    assert not leases.lease_live(raw, NOW) and not leases.election_live(raw, NOW)
    assert leases.claim_removable(raw, NOW)
    assert leases.blocking_seconds(raw, NOW) == 0 and leases.election_seconds(raw, NOW) == 0
    assert leases.record_timing(raw, NOW) == (0, 0)
    assert not leases.holder_gone(raw if isinstance(raw, dict) else {})


def test_a_well_formed_record_parses_and_a_huge_pid_on_this_host_is_never_gone():
    from research_agent.storage.leases import holder_gone, parse_record

    assert parse_record(json.dumps(GOOD)) == GOOD
    older = {k: v for k, v in GOOD.items() if k not in ("pid", "started", "token")}  # an older version's record
    assert parse_record(older) == {**older, "started": NOW}
    assert not holder_gone(_here(pid=2**70))  # old code: OverflowError
    assert not holder_gone(_here(pid=True))  # old code: pid 1 (init), "alive"


def test_the_election_counts_a_record_until_no_clock_within_the_skew_can_count_it_live():
    """Finding 3's rule: an election honours every claim and lease not yet removable: dated up to 2 x the skew
    ahead or up to LEASE_SECONDS + skew old; writes still honour a lease only within [-skew, LEASE_SECONDS]."""
    from research_agent.storage.leases import (
        CLOCK_SKEW_SECONDS as S,
        ELECTION_SECONDS,
        LEASE_SECONDS as L,
        claim_removable,
        election_live,
        election_seconds,
        lease_live,
    )

    for age, writes, elections in ((0, True, True), (L + 1, False, True), (L + S - 1, False, True),
                                   (L + S + 1, False, False), (-S - 50, False, True), (-2 * S + 1, False, True),
                                   (-2 * S - 1, False, False)):
        record = {**GOOD, "renewed": NOW - age}
        assert lease_live(record, NOW) is writes, age
        assert election_live(record, NOW) is elections and claim_removable(record, NOW) is not elections, age
        if elections:
            assert election_seconds(record, NOW) == pytest.approx(ELECTION_SECONDS - age)


def test_quoted_times_never_exceed_the_longest_a_record_can_block():
    """Finding 5: doctor quoted 'blocks for 121 s' for a record renewed just after its `now` (> LEASE_SECONDS
    for a record shown as 0 s old). A record's wait is clamped to LEASE_SECONDS (ELECTION_SECONDS for
    elections) plus the lead it is shown with."""
    from research_agent.storage.leases import ELECTION_SECONDS, LEASE_SECONDS, record_timing

    for lead in (0.2, 0.9):
        record = {**GOOD, "renewed": NOW + lead}
        assert record_timing(record, NOW) == (0, int(LEASE_SECONDS))
        assert record_timing(record, NOW, election=True) == (0, int(ELECTION_SECONDS))
    assert record_timing({**GOOD, "renewed": NOW + 60}, NOW) == (-60, int(LEASE_SECONDS) + 60)


# -- on a real server ----------------------------------------------------------------------------------------------
def _put_raw(c, key: str, collection: str, doc) -> None:
    """A lease record stored as given (any text, not only what registry_put would write)."""
    from research_agent.storage.leases import LEASE

    text = doc if isinstance(doc, str) else json.dumps(doc)
    c.store.meta.upsert(ids=[key], embeddings=[[1.0]], documents=[text],
                        metadatas=[{"record": LEASE, "collection": collection}])


@pytest.mark.slow
def test_malformed_records_block_nothing_doctor_lists_them_and_repair_removes_them(tmp_path, chroma_server,
                                                                                   fake_embedder):
    """Finding 1: each of these records made doctor and doctor --repair exit 1 'Unexpected failure', and the
    reindex (and, for a lease, every write) of its collection fail. Now: writes and the reindex go through,
    the election removes the malformed claims, doctor lists every malformed record as a leftover (not healthy),
    and --repair removes them all (leases too) and says so."""
    from research_agent.ingest.service import ingest_path
    from research_agent.storage.leases import ReindexLease, lease_key

    claimed, leased = _unique("badclaim"), _unique("badlease")
    bad = ["renewed null", "renewed text", "renewed NaN", "started 1e20", "pid 2**70", "a list", "not JSON",
           "host int", "pid true"]
    c = _open(chroma_server)
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        _seed(c, tmp_path / "a", claimed, 1)
        docs = _seed(c, tmp_path / "b", leased, 1)
        for i, name in enumerate(bad):
            raw = MALFORMED[name]
            if name == "pid 2**70":
                raw = _here(pid=2**70, renewed=time.time())
            _put_raw(c, f"lease:claim:{claimed}:{i:032x}", claimed, raw)
        _put_raw(c, f"lease:claim:{claimed}:x:y", claimed, {**FOREIGN, "renewed": time.time()})  # key != meta
        _put_raw(c, lease_key(leased), leased, {**FOREIGN, "renewed": time.time(), "started": 1e20})

        env = _server_env(chroma_server)
        checked = run_cli(tmp_path, "--json", "doctor", fake=True, env=env)
        assert checked.returncode == 1 and "Unexpected failure" not in checked.stderr, checked.stderr[-2000:]
        report = json.loads(checked.stdout)
        assert report["healthy"] is False and report["reindex_claims"] == [] and report["reindexes"] == []
        [listed] = [item for item in report["leftovers"] if "malformed" in item]
        assert listed.startswith(f"{len(bad) + 2} malformed"), listed

        (docs / "d0.txt").write_text("document d0 second version\n")
        assert ingest_path(c, docs / "d0.txt", leased).updated == 1  # the malformed lease blocks no write
        assert not c.store.registry_find("intent", leased)
        with ReindexLease(c.store, claimed, stale_intent_seconds=600):  # nor the election
            assert _claims(c, claimed) == set(), "the election left malformed claims"
        with ReindexLease(c.store, leased, stale_intent_seconds=600):
            pass

        _put_raw(c, f"lease:claim:{claimed}:{'f' * 32}", claimed, "{not json")
        _put_raw(c, lease_key(leased), leased, "[1]")
        repaired = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
        after = json.loads(repaired.stdout)
        assert repaired.returncode == 0 and after["healthy"] is True, (after, repaired.stderr[-2000:])
        assert any("removed 2 malformed" in a for a in after["actions"]), after["actions"]
        assert not c.store.meta.get(where={"record": "lease"})["ids"]
    finally:
        c.close()


@pytest.mark.slow
def test_a_write_whose_lease_check_fails_in_any_way_leaves_no_intent(tmp_path, chroma_server, fake_embedder,
                                                                     monkeypatch):
    """Finding 1: the intent was cleared only when the check raised StoreUnavailableError; any other error (a
    malformed record's TypeError, a broken connection's own exception) left it for 600 s."""
    from research_agent.ingest.service import ingest_path
    from research_agent.storage import writer

    collection = _unique("intent")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 1)

        def broken(store, name):
            raise RuntimeError("the check broke")

        monkeypatch.setattr(writer, "check_no_reindex", broken)
        (docs / "d0.txt").write_text("document d0 second version\n")
        with pytest.raises(RuntimeError, match="the check broke"):
            ingest_path(c, docs / "d0.txt", collection)
        assert not c.store.registry_find("intent", collection), "the failed write left its intent"
    finally:
        c.close()


@pytest.mark.slow
def test_a_reindex_failing_inside_its_election_or_drain_leaves_no_claim_or_lease(tmp_path, chroma_server,
                                                                                 fake_embedder, monkeypatch):
    """Finding 2: an error between writing the claim and winning skipped __exit__: the claim stayed, and the same
    (long-lived MCP) process's next reindex was refused for 120 s naming its own pid. The claim is withdrawn on
    every way out of the election, a lease won is released when the drain fails, and a leftover claim of this
    very process is never a rival."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.leases import ReindexLease, holder, lease_key

    collection = _unique("leak")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        meta = c.store.meta
        real = meta.get

        def down(*args, **kw):  # the read-back of the claims after the settle: the server went away
            if kw.get("where") == {"$and": [{"record": "lease"}, {"collection": collection}]}:
                raise StoreUnavailableError("Chroma went away")
            return real(*args, **kw)

        monkeypatch.setattr(meta, "get", down, raising=False)
        with pytest.raises(StoreUnavailableError, match="went away"):
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("won")
        monkeypatch.delattr(meta, "get")
        assert _claims(c, collection) == set(), "the failed election left its claim"

        lease = ReindexLease(c.store, collection, stale_intent_seconds=600)
        monkeypatch.setattr(lease, "drain", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            with lease:
                pytest.fail("the body ran")
        assert not c.store.registry_get([lease_key(collection)]), "the lease of a reindex that never ran stayed"

        # This process's own leftover (its withdrawal failed: the server was down): no rival, and removed.
        _claim(c, collection, "0" * 32, time.time() - 10, **holder())
        with ReindexLease(c.store, collection, stale_intent_seconds=600):
            assert _claims(c, collection) == set()
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.parametrize("offset", [-350.0, 350.0], ids=["behind", "ahead"])
def test_a_claim_or_lease_of_a_clock_350_s_off_still_refuses_the_election(tmp_path, chroma_server, fake_embedder,
                                                                          offset):
    """Finding 3: two reindexes whose clocks differed by 350 s both won (each called the other's claim dead).
    A claim or lease dated 350 s off our clock now counts for the election (the refusal quotes how long), while
    the lease still blocks no write (writes honour only [-skew, LEASE_SECONDS])."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.ingest.service import ingest_path
    from research_agent.storage.leases import ELECTION_SECONDS, LEASE, ReindexLease, lease_key

    collection = _unique("skew")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 1)
        claim = _claim(c, collection, "5" * 32, time.time() + offset)
        with pytest.raises(StoreUnavailableError, match="claimed its lease") as refused:
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("won beside a claim of a clock 350 s off")
        wait = refused.value.data["retry_after_seconds"]
        assert ELECTION_SECONDS + offset - 5 <= wait <= ELECTION_SECONDS + offset, wait
        c.store.registry_delete([claim])
        c.store.registry_put({lease_key(collection): {**FOREIGN, "started": time.time(),
                                                      "renewed": time.time() + offset, "token": "o"}},
                             LEASE, collection)
        with pytest.raises(StoreUnavailableError, match="already being reindexed by"):
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("won beside a lease of a clock 350 s off")
        (docs / "d0.txt").write_text("document d0 second version\n")
        assert ingest_path(c, docs / "d0.txt", collection).updated == 1
    finally:
        c.close()


SKEWED_TAKER = '''
import sys, time
off, at = float(sys.argv[2]), float(sys.argv[3])
real = time.time
time.time = lambda: real() + off
from research_agent.container import build_container
from research_agent.errors import StoreUnavailableError
from research_agent.storage import leases
c = build_container()
c.store.registry_find("lease", sys.argv[1])
time.sleep(max(0.0, at - real()))
try:
    with leases.ReindexLease(c.store, sys.argv[1], stale_intent_seconds=600):
        print("won", flush=True)
        time.sleep(3)
except StoreUnavailableError as exc:
    print("lost", exc.message, flush=True)
'''


@pytest.mark.slow
def test_two_reindexes_whose_clocks_differ_by_350_s_never_both_win(tmp_path, chroma_server, fake_embedder):
    """Finding 3 as the attacker ran it (/tmp/a1/skew.py): two processes, clocks 0 and -350 s, electing at the
    same moment: old code, both won."""
    collection = _unique("skew2")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        (tmp_path / "taker.py").write_text(SKEWED_TAKER, encoding="utf-8")
        at = time.time() + 8
        procs = [subprocess.Popen([sys.executable, str(tmp_path / "taker.py"), collection, str(off), str(at)],
                                  env=_server_env(chroma_server), cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for off in (0.0, -350.0)]
        outs = [p.communicate(timeout=90) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
        assert [out.split()[0] for out, _ in outs].count("won") <= 1, outs
    finally:
        c.close()


@pytest.mark.slow
def test_doctor_shows_no_control_characters_of_a_forged_host(tmp_path, chroma_server, fake_embedder):
    """Finding 4: a forged lease host 'evil\\x1b[2J' was printed raw in doctor's `note:` lines (clearing the
    user's screen). Such a host is no machine's name: both records are malformed (round 2: a newline printed a
    fake 'store: healthy' line), block nothing, and doctor lists them by key with nothing raw on the terminal."""
    from research_agent.storage.leases import LEASE, lease_key

    collection = _unique("esc")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        host = "evil\x1b[2J\x1b]8;;http://x\x07\u202e"
        c.store.registry_put({lease_key(collection): {**FOREIGN, "host": host, "started": time.time(),
                                                      "renewed": time.time(), "token": "z"}}, LEASE, collection)
        _claim(c, collection, "6" * 32, time.time(), **{**FOREIGN, "host": host})
        text = run_cli(tmp_path, "doctor", fake=True, env=_server_env(chroma_server))
        assert text.returncode == 1 and "2 malformed" in text.stdout, (text.stdout[-2000:], text.stderr[-2000:])
        for stream in (text.stdout, text.stderr):
            assert not any(ch in stream for ch in "\x1b\x07\u202e"), repr(stream[-1500:])
        report = json.loads(run_cli(tmp_path, "--json", "doctor", fake=True, env=_server_env(chroma_server)).stdout)
        assert report["reindexes"] == [] and report["reindex_claims"] == []
        assert any("2 malformed" in item for item in report["leftovers"]), report["leftovers"]
    finally:
        c.close()


@pytest.mark.slow
def test_refusals_and_doctor_quote_honest_times_and_one_claim_source(tmp_path, chroma_server, fake_embedder):
    """Finding 5: a same-host rival still mid-election (alive, younger than the settle) made the refusal quote
    119 s though a retry succeeds in about a second; a claim dated 300-600 s ahead was called healthy though it
    blocks later; doctor parsed claim keys itself (a key 'lease:claim:c:x:y' with metadata 'c' was listed as a
    claim on 'c:x', and blocked the election of 'c') while elections find claims by their metadata."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.ops.doctor import run_doctor
    from research_agent.storage.leases import CLOCK_SKEW_SECONDS, ReindexLease, holder

    collection = _unique("times")
    c = _open(chroma_server)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _seed(c, tmp_path, collection, 1)
        mid = _claim(c, collection, "1" * 32, time.time(), **{**holder(), "pid": alive.pid})
        with pytest.raises(StoreUnavailableError, match="claimed its lease") as refused:
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("won beside a live claim")
        assert 1 <= refused.value.data["retry_after_seconds"] <= 3, refused.value.data
        c.store.registry_delete([mid])

        ahead = _claim(c, collection, "2" * 32, time.time() + CLOCK_SKEW_SECONDS + 100)
        _put_raw(c, f"lease:claim:{collection}:x:y", collection, {**FOREIGN, "renewed": time.time()})
        report = run_doctor(c)
        assert not report.healthy
        [listed] = report.reindex_claims
        assert (listed.collection, listed.age_seconds < 0) == (collection, True), report.reindex_claims
        assert listed.blocks_for_seconds > 500, listed
        assert any("malformed" in item and ":x:y" in item for item in report.leftovers), report.leftovers
        assert ahead
    finally:
        alive.kill()
        alive.wait()
        c.close()


@pytest.mark.slow
def test_a_reindex_that_lost_its_lease_ends_with_the_coded_error(tmp_path, chroma_server, fake_embedder):
    """Finding 5: a reindex paused past the election window, then resumed after another reindex had taken its
    lease over and finished, ended with 'Unexpected failure (NotFoundError)'. Its next renewal, or its failure,
    is now the coded 'lost its lease' error."""
    import chromadb

    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.leases import LEASE_RENEW_SECONDS, ReindexLease, lease_key

    collection = _unique("lost")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        with pytest.raises(StoreUnavailableError, match="lost its lease"):
            with ReindexLease(c.store, collection, stale_intent_seconds=600) as lease:
                c.store.registry_delete([lease_key(collection)])  # taken over by another, which then ended
                lease.renewed -= LEASE_RENEW_SECONDS
                lease.renew()
        with pytest.raises(StoreUnavailableError, match="lost its lease") as lost:
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                c.store.registry_delete([lease_key(collection)])
                c.store.client.get_collection("research-agent-tmp-00000000-gone")  # the store's own error
        assert isinstance(lost.value.__cause__, chromadb.errors.NotFoundError)
    finally:
        c.close()


def test_a_record_of_our_host_and_pid_in_another_pid_namespace_is_another_process():
    """Attack pass, round 2: the write check compared host and pid only, so a lease of another container with our
    host name and pid (host networking, small pids) let writes through its reindex; the election, which compares
    the pid namespace too, refused. Both now agree; an older record without a namespace is ours by host and pid."""
    from research_agent.storage.leases import _elsewhere, holder

    me = holder()
    assert me["pidns"], "needs Linux (/proc/self/ns/pid)"
    assert not _elsewhere(me)
    assert _elsewhere({**me, "pidns": "pid:[4026599999]"})
    assert not _elsewhere({k: v for k, v in me.items() if k != "pidns"})
    assert _elsewhere({**me, "pid": me["pid"] + 1})
