"""Records files (JSON, JSONL, CSV) as one document per record, on a real embedded Chroma and the packaged
MiniLM model: round trips, the incremental contract (unchanged = nothing embedded, a changed record alone
re-embedded, --prune), per-record problems with their lines, hostile input in bounded memory, the CLI
command and the MCP tool, and a ToolGym tool catalog that discovery and query search (issue 17)."""

from __future__ import annotations

import json
import resource
import shutil
from pathlib import Path

import pytest

from research_agent.catalog import collections
from research_agent.errors import DocumentError
from research_agent.ingest import records
from research_agent.ingest.records import RecordFields, ingest_records

FIXTURES = Path(__file__).parent / "fixtures" / "records"
TOOLS = RecordFields(id="id", text=("description", "parameters"), title="name", keywords="tags",
                     metadata=("server.name",))


def _copy(name: str) -> Path:
    target = Path.cwd() / name
    shutil.copy(FIXTURES / name, target)
    return target


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


class CountingEmbedder:
    """The real embedder, counting the texts it embeds (what "nothing re-embedded" means)."""

    def __init__(self, inner):
        self.inner, self.texts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def embed_documents(self, texts):
        self.texts.extend(texts)
        return self.inner.embed_documents(texts)


@pytest.fixture
def counted(container, monkeypatch):
    counter = CountingEmbedder(container.embedder)
    monkeypatch.setattr(type(container), "embedder", property(lambda self: counter), raising=False)
    return counter


# -- the ToolGym catalog, ingested once ----------------------------------------------------------------
@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    from conftest import isolated_container

    root = tmp_path_factory.mktemp("records")
    with isolated_container(root) as c:
        collections.create_collection(c, "tools")
        report = ingest_records(c, FIXTURES / "mcp_tools.jsonl", "tools", TOOLS)
        yield c, report
        c.close()


@pytest.mark.slow
def test_jsonl_catalog_round_trip_and_fields(catalog):
    from research_agent import ingest

    c, report = catalog
    assert (report.added, report.records_seen, report.skipped, report.format) == (91, 91, [], "jsonl")
    doc = ingest.get_document(c, "tools", "mcp_tools.jsonl#@benbonn/utapimcp/track-shipment")
    assert doc.kind == "record" and doc.title == "track-shipment"
    assert "Track a shipment using DHL API" in doc.content and "server.name: @benbonn/utapimcp" in doc.content
    meta = c.store.get_collection("tools").get(where={"source_document": doc.document},
                                               include=["metadatas"])["metadatas"][0]
    assert meta["document_title"] == "track-shipment" and meta["keywords"] == ["benbonn"]
    assert "line_start" not in meta  # lines of the record's own text are not lines of the file


@pytest.mark.slow
@pytest.mark.parametrize("task, tool", [
    ("where is my DHL package right now, I have its tracking number", "track-shipment"),
    ("what is on the front page of Hacker News today", "hn_"),
    ("turn a GPS lat/lon pair into the nearest street address or place name", "reverse_geocode"),
])
def test_discovery_and_query_find_the_tool_for_a_task(catalog, task, tool):
    from research_agent.discovery import discover_context
    from research_agent.search import service as query

    c, _ = catalog
    found = discover_context(c, task, max_results=3).recommendations
    assert any(tool in r.title for r in found), [r.title for r in found]
    hits = query.query_knowledge(c, task, collections=["tools"], rerank=False).results[:3]
    assert any(tool in h.metadata["document_title"] for h in hits), [h.metadata["document_title"] for h in hits]


# -- the incremental contract ------------------------------------------------------------------------------
@pytest.mark.slow
def test_rerun_changed_record_and_prune(container, counted):
    collections.create_collection(container, "recs")
    path = _copy("mcp_tools.jsonl")
    rows = _lines(path)[:6]
    _write(path, rows)
    first = ingest_records(container, path, "recs", TOOLS)
    assert first.added == 6 and len(counted.texts) == first.chunks_written
    counted.texts.clear()
    again = ingest_records(container, path, "recs", TOOLS)
    assert (again.unchanged, again.added, again.updated, again.chunks_written, counted.texts) == (6, 0, 0, 0, [])

    rows[2]["description"] = "Fetch the users of a workspace, sorted by the zodiac sign"
    rows[4]["unmapped"] = "a field no mapping reads"  # not part of the document: no re-embedding
    _write(path, rows[:5])  # and the last record is gone
    changed = ingest_records(container, path, "recs", TOOLS)
    assert (changed.updated, changed.unchanged, changed.removed) == (1, 4, 0)
    assert changed.documents == [f"mcp_tools.jsonl#{rows[2]['id']}"]
    assert all("zodiac" in t for t in counted.texts) and counted.texts
    from research_agent import ingest

    assert len(ingest.list_documents(container, "recs").documents) == 6  # without --prune the vanished one stays
    pruned = ingest_records(container, path, "recs", TOOLS, prune=True)
    assert pruned.removed_documents == [f"mcp_tools.jsonl#{rows[5]['id']}"] and pruned.unchanged == 5
    assert len(ingest.list_documents(container, "recs").documents) == 5


@pytest.mark.slow
def test_json_under_records_path_and_csv_with_dotted_header(container):
    collections.create_collection(container, "recs")
    report = ingest_records(container, _copy("mcp_tools.json"), "recs",
                            RecordFields(id="id", text=("description",), title="name", keywords="tags",
                                         metadata=("server.title",), records_path="catalog.tools"))
    assert report.added == 13 and report.format == "json"
    report = ingest_records(container, _copy("mcp_tools.csv"), "recs",
                            RecordFields(id="id", text=("description",), title="name", keywords="tags",
                                         metadata=("server.name",)))
    assert report.added == 13 and report.format == "csv" and not report.skipped
    from research_agent import ingest

    doc = ingest.get_document(container, "recs", "mcp_tools.csv#@imprvhub/mcp-claude-hackernews/hn_top")
    assert "server.name: @imprvhub/mcp-claude-hackernews" in doc.content
    with pytest.raises(DocumentError, match="no array of records at the top level; arrays under: catalog.tools"):
        ingest_records(container, Path.cwd() / "mcp_tools.json", "recs",
                       RecordFields(id="id", text=("description",)))


# -- problems: per record, with the line --------------------------------------------------------------------
@pytest.mark.slow
def test_malformed_records_are_skipped_with_their_lines_and_block_prune(container):
    collections.create_collection(container, "recs")
    path = Path.cwd() / "tools.jsonl"
    good = {"id": "a", "description": "alpha tool"}
    path.write_text("\n".join([json.dumps(good), "{not json", json.dumps({"description": "no id"}),
                               json.dumps({"id": "b"}), "[1, 2]", json.dumps({"id": "c", "description": "gamma"}),
                               json.dumps({"id": "a", "description": "alpha tool, fixed"})]) + "\n")
    report = ingest_records(container, path, "recs", RecordFields(id="id", text=("description",)))
    reasons = {p.path: p.reason for p in report.skipped}
    assert set(reasons) == {"tools.jsonl:2", "tools.jsonl:3", "tools.jsonl:4", "tools.jsonl:5"}
    assert "not valid JSON" in reasons["tools.jsonl:2"] and "no id" in reasons["tools.jsonl:3"]
    assert "no text" in reasons["tools.jsonl:4"] and "not a JSON object" in reasons["tools.jsonl:5"]
    assert report.added == 2 and report.records_seen == 7
    assert [w.reason for w in report.warnings] == ["id repeated at line 7 (first at line 1): the later record wins"]
    from research_agent import ingest

    assert ingest.get_document(container, "recs", "tools.jsonl#a").content == "alpha tool, fixed"
    path.write_text("{broken\n" + json.dumps(good) + "\n")  # c is gone, but line 1 might have been c
    kept = ingest_records(container, path, "recs", RecordFields(id="id", text=("description",)), prune=True)
    assert kept.removed == 0 and "nothing was pruned" in kept.not_pruned[0].reason


def test_a_record_that_loses_its_text_loses_its_old_version(container, fake_embedder):
    collections.create_collection(container, "recs")
    path = Path.cwd() / "t.jsonl"
    _write(path, [{"id": "a", "text": "one"}, {"id": "b", "text": "two"}])
    ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)))
    _write(path, [{"id": "a", "text": ""}, {"id": "b", "text": "two"}])
    report = ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)))
    assert report.removed_documents == ["t.jsonl#a"] and "previous version was removed" in report.skipped[0].reason


def test_mapping_and_file_errors_are_coded(container, fake_embedder):
    collections.create_collection(container, "recs")
    with pytest.raises(DocumentError, match="id field and at least one text field"):
        RecordFields(id="id", text=())
    csv_path = Path.cwd() / "t.csv"
    csv_path.write_text("name,body\nx,y\n")
    with pytest.raises(DocumentError, match="no column 'id'") as err:
        ingest_records(container, csv_path, "recs", RecordFields(id="id", text=("body",)))
    assert "name, body" in err.value.data["guidance"]
    with pytest.raises(DocumentError, match="no column 'text'"):  # the id is there, no text column is
        ingest_records(container, csv_path, "recs", RecordFields(id="name", text=("text",)))
    with pytest.raises(DocumentError, match="Unsupported records format"):
        ingest_records(container, csv_path, "recs", RecordFields(id="name", text=("body",)), format="xml")
    bad = Path.cwd() / "bad.json"
    bad.write_text("[" * 100_000)
    with pytest.raises(DocumentError, match="nested too deeply|not valid JSON"):
        ingest_records(container, bad, "recs", RecordFields(id="id", text=("t",)))


# -- hostile input, bounded memory ------------------------------------------------------------------------
def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_huge_line_deep_nesting_and_huge_csv_field_are_skipped_in_bounded_memory(container, fake_embedder):
    collections.create_collection(container, "recs")
    jsonl = Path.cwd() / "hostile.jsonl"
    with jsonl.open("w") as fh:
        fh.write(json.dumps({"id": "ok1", "text": "first"}) + "\n")
        fh.write('{"id": "big", "text": "' + "x" * (50 * 2**20) + '"}\n')  # one 50 MB line
        fh.write("[" * 200_000 + "\n")                                      # deeply nested
        fh.write(json.dumps({"id": "deep", "text": "t", "nested": {"a": [[[[[[1]]]]]]}}) + "\n")
        fh.write(json.dumps({"id": "ok2", "text": "second"}) + "\n")
    before = _peak_mb()
    report = ingest_records(container, jsonl, "recs", RecordFields(id="id", text=("text",), metadata=("nested",)))
    assert _peak_mb() - before < 40  # the 50 MB line was never held whole
    reasons = {p.path: p.reason for p in report.skipped}
    assert reasons == {"hostile.jsonl:2": "longer than 1 MB", "hostile.jsonl:3": "nested too deeply to read"}
    assert report.added == 3

    csv_path = Path.cwd() / "hostile.csv"
    with csv_path.open("w") as fh:
        fh.write("id,text\nr1,fine\nr2," + "y" * (10 * 2**20) + "\nr3,also fine\n")
    report = ingest_records(container, csv_path, "recs", RecordFields(id="id", text=("text",)))
    assert [(p.path, p.reason) for p in report.skipped] == [("hostile.csv:3", "line 3 longer than 1 MB")]
    assert report.added == 2


def test_csv_field_over_the_csv_limit_ends_the_file_with_its_line(container, fake_embedder):
    collections.create_collection(container, "recs")
    path = Path.cwd() / "q.csv"
    path.write_text('id,text\nr1,fine\nr2,"' + ("z" * 1000 + "\n") * 200 + '"\nr3,after\n')
    report = ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)))
    assert report.added == 1 and "rest of the file was not read" in report.skipped[0].reason
    assert report.skipped[0].path.startswith("q.csv:")


def test_json_file_over_the_cap_is_refused(container, fake_embedder, monkeypatch):
    collections.create_collection(container, "recs")
    monkeypatch.setattr(records, "MAX_JSON_FILE_BYTES", 1000)
    path = Path.cwd() / "big.json"
    path.write_text(json.dumps([{"id": str(i), "t": "x" * 50} for i in range(50)]))
    with pytest.raises(DocumentError, match="limit for a JSON file") as err:
        ingest_records(container, path, "recs", RecordFields(id="id", text=("t",)))
    assert "jq -c" in err.value.data["guidance"]


def test_same_file_name_in_two_folders_gets_distinct_keys(container, fake_embedder):
    collections.create_collection(container, "recs")
    for sub in ("a", "b"):
        (Path.cwd() / sub).mkdir()
        _write(Path.cwd() / sub / "tools.jsonl", [{"id": "x", "text": f"from {sub}"}])
    one = ingest_records(container, Path.cwd() / "a" / "tools.jsonl", "recs", RecordFields(id="id", text=("text",)))
    two = ingest_records(container, Path.cwd() / "b" / "tools.jsonl", "recs", RecordFields(id="id", text=("text",)))
    assert one.documents == ["tools.jsonl#x"]
    assert two.documents == [f"{(Path.cwd() / 'b' / 'tools.jsonl').resolve().as_posix()}#x"]
    again = ingest_records(container, Path.cwd() / "a" / "tools.jsonl", "recs", RecordFields(id="id", text=("text",)))
    assert again.unchanged == 1


# -- the CLI command and the MCP tool ---------------------------------------------------------------------
def _cli_app():
    """The real root callback and error boundary with `kb add-records` mounted on a test app (the lead
    registers it on the real kb group; mounting it there here would leak into other tests, e.g. parity)."""
    import typer

    from research_agent.cli.main import ResearchAgentGroup, main
    from research_agent.cli.records import add_records

    app = typer.Typer(cls=ResearchAgentGroup, pretty_exceptions_enable=False)
    app.callback()(main)
    kb = typer.Typer()
    kb.command("add-records")(add_records)
    app.add_typer(kb, name="kb")
    return app


def test_cli_add_records_json_output(container, fake_embedder):
    from typer.testing import CliRunner

    collections.create_collection(container, "recs")
    path = _copy("mcp_tools.csv")
    main_app = _cli_app()
    result = CliRunner().invoke(main_app, ["--json", "kb", "add-records", str(path), "--collection", "recs",
                                           "--id-field", "id", "--text-field", "description", "--title-field",
                                           "name", "--metadata-field", "server.name"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["added"] == 13 and data["format"] == "csv"
    result = CliRunner().invoke(main_app, ["--json", "kb", "add-records", str(path), "--collection", "recs",
                                           "--id-field", "nope", "--text-field", "description"])
    assert result.exit_code == 5 and "no column 'nope'" in result.stderr
    result = CliRunner().invoke(main_app, ["kb", "add-records", str(path), "--collection", "recs", "--id-field",
                                           "id", "--text-field", "description"])  # no title or metadata now
    assert result.exit_code == 0 and "13 updated" in result.stdout and "13 records read (csv)" in result.stdout


def test_mcp_ingest_records_tool(container, fake_embedder, no_warmup):
    """Records over MCP are `ingest_documents` with a `records` mapping (one tool to put things in: tools/list
    stays within an agent's budget), on the same library function as kb add-records."""
    import asyncio

    from fastmcp import Client

    from research_agent.mcp.server import create_server

    collections.create_collection(container, "recs")
    path = _copy("mcp_tools.json")
    mcp = create_server()

    async def call(args):
        async with Client(mcp) as client:
            return await client.call_tool("ingest_documents", args, raise_on_error=False)

    mapping = {"id_field": "id", "text_fields": ["description"], "title_field": "name",
               "records_path": "catalog.tools"}
    args = {"path": str(path), "collection": "recs", "records": mapping}
    result = asyncio.run(call(args))
    assert not result.is_error and result.structured_content["added"] == 13
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError, match="outside the allowed roots"):
        asyncio.run(call({**args, "path": "/etc/passwd"}))
    with pytest.raises(MCPError, match="id field and at least one text field"):
        asyncio.run(call({**args, "records": {**mapping, "text_fields": []}}))


async def _tools(mcp):
    return await mcp.list_tools()


# -- attack pass: swallowed rows, the JSON cap, a records file path to `kb get` ----------------------------
def test_an_unclosed_csv_quote_is_reported_and_blocks_prune(container, fake_embedder):
    """An unclosed quote swallows every later row into one field: read leniently, k2 and k3 looked gone and
    --prune removed them with no warning. The strict reader reports the row's line and prune is blocked."""
    from research_agent import ingest

    collections.create_collection(container, "recs")
    path = Path.cwd() / "cat.csv"
    path.write_text("id,text\nk1,first\nk2,second\nk3,third\n")
    assert ingest_records(container, path, "recs", RecordFields(id="id", text=("text",))).added == 3
    path.write_text('id,text\nk1,"first unbalanced\nk2,second\nk3,third\n')
    report = ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)), prune=True)
    assert report.removed == 0 and report.not_pruned and "nothing was pruned" in report.not_pruned[0].reason
    assert [p.path for p in report.skipped] == ["cat.csv:2"] and "quote" in report.skipped[0].reason
    assert ingest.get_document(container, "recs", "cat.csv#k2").content == "second"
    assert ingest.get_document(container, "recs", "cat.csv#k1").content == "first"


def test_tsv_quotes_are_text(container, fake_embedder):
    """TSV has no quoting convention: `"5 inch" screen` stays as written and a lone quote swallows nothing."""
    from research_agent import ingest

    collections.create_collection(container, "recs")
    path = Path.cwd() / "cat.tsv"
    path.write_text('id\ttext\nt1\t"5 inch" screen\nt2\tsays "hi\nt3\tthird\n')
    report = ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)))
    assert report.added == 3 and report.skipped == []
    assert ingest.get_document(container, "recs", "cat.tsv#t1").content == '"5 inch" screen'
    assert ingest.get_document(container, "recs", "cat.tsv#t2").content == 'says "hi'


def test_json_cap_keeps_the_parse_near_300_mb(container, fake_embedder):
    """A JSON array is parsed whole at ~40x its size for small objects (`[{},{},...]`: 8 MB peaked at 324 MB,
    32 MB at 965 MB), so the cap is 8 MB and the error points to JSONL, which streams."""
    collections.create_collection(container, "recs")
    path = Path.cwd() / "big.json"
    path.write_bytes(b"[" + b"{}," * (3 * 2**20) + b"{}]")  # ~9 MB
    with pytest.raises(DocumentError, match="8 MB limit") as err:
        ingest_records(container, path, "recs", RecordFields(id="id", text=("t",)))
    assert "JSON lines" in err.value.data["guidance"] and "jq -c" in err.value.data["guidance"]


def test_a_records_file_path_is_ambiguous_not_one_record(container, fake_embedder):
    """`kb get <records file>` named every record of the file and returned an arbitrary one."""
    from research_agent import ingest

    collections.create_collection(container, "recs")
    path = Path.cwd() / "odd.jsonl"
    _write(path, [{"id": f"r{i}", "text": f"record {i}"} for i in range(8)])
    ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)))
    with pytest.raises(DocumentError, match="ambiguous") as err:
        ingest.get_document(container, "recs", str(path))
    assert "odd.jsonl#r0" in err.value.message and "odd.jsonl#" in err.value.data["guidance"]
    assert len(err.value.data["candidates"]) == 5
    assert ingest.get_document(container, "recs", "odd.jsonl#r3").content == "record 3"


def test_a_repeated_id_whose_first_copy_was_written_warns_and_the_later_wins(container, fake_embedder,
                                                                              monkeypatch):
    """The earlier copy was committed in an earlier batch; the later copy has no text. It was skipped with no
    "id repeated" warning and the earlier text stayed searchable: now it warns, and the later record wins
    (no text: the written version is removed, as for a record that loses its text)."""
    from research_agent import ingest

    collections.create_collection(container, "recs")
    monkeypatch.setattr(records, "EMBED_BATCH_CHUNKS", 1)  # every record is its own batch
    path = Path.cwd() / "rep.jsonl"
    _write(path, [{"id": "a", "text": "first copy"}, {"id": "b", "text": "other"}, {"id": "a", "text": ""}])
    report = ingest_records(container, path, "recs", RecordFields(id="id", text=("text",)))
    assert [w.path for w in report.warnings] == ["rep.jsonl#a"] and "repeated" in report.warnings[0].reason
    assert [p.path for p in report.skipped] == ["rep.jsonl:3"] and report.added == 1
    assert [d.document for d in ingest.list_documents(container, "recs").documents] == ["rep.jsonl#b"]
