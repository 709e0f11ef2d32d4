"""The reindex lease's claims (storage/leases.py): seen by doctor, cleaned when dead, and honest waiting times.

Attack findings (round H1): a claim left by a reindex that died before winning or withdrawing blocked every other
reindex of its collection for up to LEASE_SECONDS while `doctor` called the store healthy and the refusal said to
run it again at once; the time quoted for a lease dated ahead of our clock counted from our clock (too short);
dead claims were never removed. A real `chroma run` server (tests/conftest.py `chroma_server`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from test_concurrency import run_cli
from test_server_writes import _open, _seed, _server_env, _unique

FOREIGN = {"host": "another-machine", "pidns": None, "pid": 4242}


def _exited_pid() -> int:
    """The pid of a process that ran on this machine and has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _claim(c, collection: str, token: str, renewed: float, **who) -> str:
    """A claim as ReindexLease._take writes it (`lease:claim:<collection>:<token>`)."""
    from research_agent.storage.leases import LEASE

    key = f"{LEASE}:claim:{collection}:{token}"
    c.store.registry_put({key: {"started": renewed, "renewed": renewed, "token": token, **(who or FOREIGN)}},
                         LEASE, collection)
    return key


def _claims(c, collection: str) -> set[str]:
    return {k for k in c.store.registry_find("lease", collection) if k.startswith("lease:claim:")}


# -- pure logic: how long a lease or claim still blocks --------------------------------------------------------
def test_blocking_time_counts_from_the_records_own_date_even_ahead_of_our_clock():
    """Finding 2: a lease renewed 60 s ahead of our clock stays live until now - renewed > LEASE_SECONDS, i.e.
    LEASE_SECONDS + 60 s from now, not LEASE_SECONDS; a dead or absurdly dated one blocks nothing."""
    from research_agent.storage.leases import CLOCK_SKEW_SECONDS, LEASE_SECONDS, blocking_seconds, lease_live

    now = 1_800_000_000.0
    for renewed, expected in ((now, LEASE_SECONDS), (now - 30, LEASE_SECONDS - 30), (now + 60, LEASE_SECONDS + 60),
                              (now - LEASE_SECONDS - 1, 0.0), (now + CLOCK_SKEW_SECONDS + 1, 0.0)):
        record = {**FOREIGN, "started": now, "renewed": renewed}
        assert blocking_seconds(record, now) == pytest.approx(expected), renewed
        # It blocks exactly as long as lease_live says: live just before the quoted time, dead just after.
        if expected:
            assert lease_live(record, now + expected - 0.5) and not lease_live(record, now + expected + 0.5)


def test_a_claim_is_deleted_only_when_no_clock_within_the_skew_can_count_it_live():
    """Finding 3's rule: a claim is removable when its holder is known gone from this machine, or when it is dead
    to every machine whose clock is within CLOCK_SKEW_SECONDS of ours; one merely dead to our clock (a machine
    300 s behind may still honour it in its election) is kept."""
    from research_agent.storage.leases import CLOCK_SKEW_SECONDS, LEASE_SECONDS, claim_removable, holder

    now = 1_800_000_000.0
    foreign = {**FOREIGN, "started": now, "token": "t"}
    assert not claim_removable({**foreign, "renewed": now}, now)
    assert not claim_removable({**foreign, "renewed": now - LEASE_SECONDS - 1}, now)  # dead here, maybe not there
    assert claim_removable({**foreign, "renewed": now - LEASE_SECONDS - CLOCK_SKEW_SECONDS - 1}, now)
    assert not claim_removable({**foreign, "renewed": now + CLOCK_SKEW_SECONDS + 1}, now)
    assert claim_removable({**foreign, "renewed": now + 2 * CLOCK_SKEW_SECONDS + 1}, now)  # absurd to every clock
    assert claim_removable({**foreign, **holder(), "pid": _exited_pid(), "renewed": now}, now)
    assert not claim_removable({**foreign, **holder(), "renewed": now}, now)  # this (live) process


# -- the election and its refusal -------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_foreign_live_claim_refuses_a_reindex_saying_when_a_retry_can_succeed(tmp_path, chroma_server,
                                                                                fake_embedder):
    """Finding 1 and 2: the refusal named the other reindex and said 'run it again' (at once). It now says how
    many seconds its claim (or lease) still blocks reindexes, counted from the record's own date (H1b: until
    ELECTION_SECONDS old, so a lease 60 s ahead of our clock blocks ELECTION_SECONDS + 60 s), in the guidance
    and as data['retry_after_seconds']; our claim is withdrawn and the foreign records are left in place."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.leases import ELECTION_SECONDS as LEASE_SECONDS, LEASE, ReindexLease, lease_key

    collection = _unique("claimed")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        foreign = _claim(c, collection, "f" * 32, time.time() - 30)
        with pytest.raises(StoreUnavailableError, match="already being reindexed") as refused:
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("took the lease beside a live claim")
        wait = refused.value.data["retry_after_seconds"]
        assert LEASE_SECONDS - 30 - 5 <= wait <= LEASE_SECONDS - 30, refused.value.data
        assert f"{wait} s" in refused.value.data["guidance"], refused.value.data["guidance"]
        assert "4242" in refused.value.message and "another-machine" in refused.value.message
        assert _claims(c, collection) == {foreign}, "our claim was not withdrawn, or the foreign one was removed"

        c.store.registry_delete([foreign])
        ahead = {**FOREIGN, "started": time.time(), "renewed": time.time() + 60, "token": "other"}
        c.store.registry_put({lease_key(collection): ahead}, LEASE, collection)
        with pytest.raises(StoreUnavailableError, match="already being reindexed") as refused:
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("took the lease beside a live lease")
        wait = refused.value.data["retry_after_seconds"]
        assert LEASE_SECONDS + 60 - 5 <= wait <= LEASE_SECONDS + 60, refused.value.data
        assert f"{wait} s" in refused.value.data["guidance"], refused.value.data["guidance"]
    finally:
        c.close()


@pytest.mark.slow
def test_a_write_refused_by_a_lease_ahead_of_our_clock_quotes_its_true_remaining_time(tmp_path, chroma_server,
                                                                                      fake_embedder):
    """Finding 2 for writes: the guidance said a dead reindex stops blocking LEASE_SECONDS after its last sign of
    life, which for a lease dated 60 s ahead is 60 s too soon. It now quotes the seconds this lease still blocks."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.ingest.service import ingest_path
    from research_agent.storage.leases import LEASE, LEASE_SECONDS, lease_key

    collection = _unique("ahead")
    c = _open(chroma_server)
    try:
        docs = _seed(c, tmp_path, collection, 1)
        c.store.registry_put({lease_key(collection): {**FOREIGN, "started": time.time(),
                                                      "renewed": time.time() + 60}}, LEASE, collection)
        (docs / "d0.txt").write_text("document d0 second version\n")
        with pytest.raises(StoreUnavailableError, match="being reindexed") as refused:
            ingest_path(c, docs / "d0.txt", collection)
        wait = refused.value.data["retry_after_seconds"]
        assert LEASE_SECONDS + 60 - 5 <= wait <= LEASE_SECONDS + 60, refused.value.data
        assert f"{wait} s" in refused.value.data["guidance"], refused.value.data["guidance"]
    finally:
        c.close()


@pytest.mark.slow
def test_the_next_election_removes_dead_claims_and_keeps_the_rest(tmp_path, chroma_server, fake_embedder):
    """Finding 3: claims of reindexes that died before winning or withdrawing piled up in the registry forever.
    The next election removes those it reads that no clock within the skew can count live, or whose holder is
    known gone from this machine (which, fresh or not, blocks nothing: it wins beside it); a claim merely past
    LEASE_SECONDS on our clock is kept (another machine's clock may still honour it), and (H1b) still counts as
    a rival: the election refuses beside it."""
    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.leases import CLOCK_SKEW_SECONDS, LEASE_SECONDS, ReindexLease, holder

    collection = _unique("dead")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        now = time.time()
        gone = _claim(c, collection, "a" * 32, now, **{**holder(), "pid": _exited_pid()})
        old = _claim(c, collection, "b" * 32, now - LEASE_SECONDS - CLOCK_SKEW_SECONDS - 60)
        absurd = _claim(c, collection, "c" * 32, now + 2 * CLOCK_SKEW_SECONDS + 60)
        with ReindexLease(c.store, collection, stale_intent_seconds=600) as lease:
            assert _claims(c, collection) == set(), "dead claims left"
            assert lease.claim not in _claims(c, collection)
        assert gone and old and absurd
        kept = _claim(c, collection, "d" * 32, now - LEASE_SECONDS - 60)
        with pytest.raises(StoreUnavailableError, match="already being reindexed"):
            with ReindexLease(c.store, collection, stale_intent_seconds=600):
                pytest.fail("won beside a claim another clock may count live")
        assert _claims(c, collection) == {kept}
    finally:
        c.close()


# -- doctor ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_doctor_lists_live_claims_with_their_time_left_and_repair_removes_only_dead_ones(tmp_path, chroma_server,
                                                                                         fake_embedder):
    """Finding 1: a live foreign claim blocks every reindex of its collection, yet doctor said healthy and did not
    list it. Now doctor (text and --json alike) lists it (whose, how old, how long it still blocks), is not
    healthy, and advises to wait; dead claims are leftovers that `doctor --repair` removes (an action), never a
    live claim or another machine's live lease (whose true time left, dated ahead, is reported too)."""
    from research_agent.storage.leases import CLOCK_SKEW_SECONDS, ELECTION_SECONDS, LEASE, LEASE_SECONDS, lease_key

    collection, other = _unique("doc"), _unique("docl")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        now = time.time()
        live = _claim(c, collection, "e" * 32, now - 20)
        env = _server_env(chroma_server)
        checked = run_cli(tmp_path, "--json", "doctor", fake=True, env=env)
        report = json.loads(checked.stdout)
        assert report["healthy"] is False and checked.returncode == 1, report  # old code: healthy, exit 0
        [claim] = report["reindex_claims"]
        assert (claim["collection"], claim["host"], claim["pid"]) == (collection, "another-machine", 4242)
        assert 18 <= claim["age_seconds"] <= 40, claim
        assert ELECTION_SECONDS - 40 <= claim["blocks_for_seconds"] <= ELECTION_SECONDS - 20, claim
        assert any("4242" in a and collection in a and f"{claim['blocks_for_seconds']} s" in a
                   for a in report["advice"]), report["advice"]
        assert report["leftovers"] == [] and not any("doctor --repair" in a for a in report["advice"]), report

        dead = _claim(c, collection, "9" * 32, now - LEASE_SECONDS - CLOCK_SKEW_SECONDS - 60)
        c.store.registry_put({lease_key(other): {**FOREIGN, "pid": 4343, "started": now, "renewed": now + 60,
                                                 "token": "x"}}, LEASE, other)
        report = json.loads(run_cli(tmp_path, "--json", "doctor", fake=True, env=env).stdout)
        assert any("dead reindex claim" in item for item in report["leftovers"]), report["leftovers"]
        [lease] = report["reindexes"]
        assert lease["collection"] == other and LEASE_SECONDS + 60 - 30 <= lease["blocks_for_seconds"] <= \
            LEASE_SECONDS + 60, lease

        text = run_cli(tmp_path, "doctor", fake=True, env=env)
        assert text.returncode == 1
        shown = " ".join(text.stdout.split())  # as one line, however the console wrapped it
        assert re.search(rf"reindex claim: {re.escape(collection)} \(pid 4242 on another-machine, claimed \d+ s "
                         rf"ago; blocks other reindexes for up to \d+ s more", shown), shown
        assert re.search(rf"reindex in progress: {re.escape(other)} \(pid 4343 on another-machine.*\d+ s",
                         shown), shown

        repaired = run_cli(tmp_path, "--json", "doctor", "--repair", fake=True, env=env)
        after = json.loads(repaired.stdout)
        assert any("removed 1 dead reindex claim" in a for a in after["actions"]), after["actions"]
        assert _claims(c, collection) == {live}
        assert lease_key(other) in c.store.registry_get([lease_key(other)])
        assert [r["collection"] for r in after["reindex_claims"]] == [collection] and after["leftovers"] == []
        assert dead
    finally:
        c.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_check_store_over_mcp_lists_a_live_claim(tmp_path, chroma_server, fake_embedder, monkeypatch):
    """The MCP face of finding 1 (a real in-memory fastmcp Client on the server's own tools): check_store reports
    the live claim in reindex_claims, with the same fields and advice as `doctor --json`, and is not healthy."""
    from fastmcp import Client

    import mcp_server
    from research_agent.storage.leases import ELECTION_SECONDS

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_HOST", chroma_server["host"])
    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_PORT", str(chroma_server["port"]))
    collection = _unique("mcp")
    c = _open(chroma_server)
    try:
        _seed(c, tmp_path, collection, 1)
        _claim(c, collection, "7" * 32, time.time() - 10)
    finally:
        c.close()
    async with Client(mcp_server.mcp) as client:
        report = (await client.call_tool("check_store", {})).structured_content
    assert report["healthy"] is False, report
    [claim] = report["reindex_claims"]
    assert (claim["collection"], claim["pid"]) == (collection, 4242)
    assert ELECTION_SECONDS - 40 <= claim["blocks_for_seconds"] <= ELECTION_SECONDS - 10, claim
    assert any(collection in a and f"{claim['blocks_for_seconds']} s more" in a for a in report["advice"])
