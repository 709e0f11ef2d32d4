"""Discovery on a code base: a task naming an exact identifier finds the one file that defines it.

Regression (issue 14, third round): after the refit that made discovery work on a 10,000-tool catalog,
`discover "debug RESERVED_PREFIX validation"` on our own docs and code fell from 0.88 to 0.67, and a task
naming an identifier found in one file of a 1,100-file corpus no longer listed that file in its top 10:
the analyzer splits `RESERVED_PREFIX` into "reserved" and "prefix", two common words, and the keyword
rank that still saw the whole token weighed less after the refit. Real parts: a generated corpus of many
small modules that all talk about keys, prefixes, validation and reserved names, ingested with the
packaged MiniLM model into a real Chroma store; only one module holds the identifier.
"""

from __future__ import annotations

import random

import pytest

from research_agent import discovery, ingest
from research_agent.catalog import collections
from research_agent.discovery import ranking

#: Words every generated module uses, so that the identifier's parts ("reserved", "prefix") are common.
_VOCAB = ("key prefix validation reserved name registry collection store check error value namespace "
          "config setting manifest chunk index revision lock swap document path id label schema parser "
          "token cache limit guard invalid allowed debug reject rule").split()
_MODULES = 120


def _module(i: int, rng: random.Random) -> str:
    """A small Python module of the shared vocabulary: a docstring, a constant and two functions."""
    words = [rng.choice(_VOCAB) for _ in range(40)]
    name = f"{words[0]}_{words[1]}_{i}"
    return (f'"""{" ".join(words[2:18]).capitalize()}."""\n\n'
            f'{words[18].upper()}_{words[19].upper()}_{i} = "{words[20]}-{i}"\n\n\n'
            f"def check_{name}(value: str) -> bool:\n"
            f'    """{" ".join(words[21:33]).capitalize()}."""\n'
            f"    return value.startswith({words[18].upper()}_{words[19].upper()}_{i})\n\n\n"
            f"def {words[33]}_{words[34]}(items: list[str]) -> list[str]:\n"
            f'    """{" ".join(words[35:40]).capitalize()} of the reserved prefix rules."""\n'
            f"    return [x for x in items if x]\n")


_TARGET = '''"""Registry keys of the store: one namespace per kind of record."""

RESERVED_PREFIX = "__ra_"


def check_user_key(key: str) -> None:
    """A user key may not start with RESERVED_PREFIX: those keys belong to the store's own records."""
    if key.startswith(RESERVED_PREFIX):
        raise ValueError(f"keys starting with {RESERVED_PREFIX!r} are reserved")
'''


def test_identifiers_are_code_like_words_not_brand_names():
    from research_agent.discovery.analysis import identifiers

    found = identifiers("debug RESERVED_PREFIX, reserved_prefix, node_id, discoverContext, RevisionCacheKey "
                        "on GitHub with JSON over HTTP, a_b")
    assert set(found) == {"reserved_prefix", "node_id", "discovercontext", "revisioncachekey"}
    assert found["reserved_prefix"] == "RESERVED_PREFIX"  # as first written, for the reason


@pytest.fixture(scope="module")
def code_base(tmp_path_factory):
    """_MODULES generated modules plus the one defining RESERVED_PREFIX, ingested with the real model."""
    from conftest import isolated_container

    root = tmp_path_factory.mktemp("codebase")
    src = root / "src"
    src.mkdir()
    rng = random.Random(11)
    for i in range(_MODULES):
        (src / f"mod_{i:03d}.py").write_text(_module(i, rng), encoding="utf-8")
    (src / "registry_keys.py").write_text(_TARGET, encoding="utf-8")
    with isolated_container(root) as c:
        collections.create_collection(c, "code")
        report = ingest.ingest_path(c, src, "code", recursive=True, include=["*.py"])
        assert report.added == _MODULES + 1 and not report.failed
    yield c
    c.close()


@pytest.mark.parametrize("task", ["debug RESERVED_PREFIX validation",
                                  "where is RESERVED_PREFIX checked?",
                                  "fix the reserved_prefix check for user keys"])
def test_a_task_naming_a_rare_identifier_ranks_its_file_first(code_base, task):
    res = discovery.discover_context(code_base, task, max_results=10, collections=["code"])
    paths = [r.path.split("#", 1)[0].rsplit("/", 1)[-1] for r in res.recommendations]
    assert "registry_keys.py" in paths[:3], (task, [(p, r.relevance_score) for p, r in zip(paths, res.recommendations)])
    top = res.recommendations[paths.index("registry_keys.py")]
    assert top.relevance_score >= 0.5 and top.priority != "skip", (task, top)
    assert "reserved_prefix" in top.reason.lower(), top.reason  # the reason names the identifier


def test_the_identifiers_common_parts_alone_do_not_pick_the_file(code_base):
    """Without the identifier the words "reserved prefix" are everywhere: no single file is a sure answer."""
    res = discovery.discover_context(code_base, "reserved prefix", max_results=10, collections=["code"])
    assert all(r.relevance_score < ranking.MUST_LOAD for r in res.recommendations), res.recommendations
