"""Charts of the benchmark tables: one PNG per table in benchmarks/charts/, linked under its table.

Usage: .venv/bin/python benchmarks/charts.py [--check] [--only NAME,...] [--docs DIR] [--out DIR] [--no-links]

Every chart is drawn from the Markdown table it shows (benchmarks/README.md and benchmarks/RESULTS.md),
found by the heading above it and the first cells of its header, so re-running this after a table is
updated redraws the chart from the new figures. RESULTS.md is rewritten wholesale by run_all.py, which
drops its image links: this script puts back any missing link (`![title](charts/<name>.png)` right under
the table) unless `--no-links`. A table that is missing or whose cells are not the figures a chart needs
is reported by chart and table name and the other charts are still drawn (exit status 1). `--check` only
parses (no matplotlib needed) and exits 1 if a charted table is missing.

Charts are 800 px wide (8 in at 100 dpi) so they read at the width a Markdown viewer shows them;
latency axes are logarithmic because one table spans 1 ms to 2 s. Where a table gives medians (p50) the
bars are the medians; p95 is a tick beside them.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTH_IN, DPI = 8.0, 100  # 800 px: the width GitHub's Markdown column shows an image at without scaling
LABEL_WRAP = 30  # characters per line of a category label; longer labels squeeze the plot area below half
#: README's calibration goal ("The goal (≤ 0.10 on SciFact and NFCorpus test)"), drawn as a line
ECE_GOAL = 0.10
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")  # matched at a cell's start: "unavailable ... L6-v2" is no figure


class TableError(Exception):
    """A charted table is missing, or its cells are not the figures its chart needs."""


@dataclass
class Table:
    """One Markdown table with the prose around it (for the machine and load named there)."""

    name: str
    header: list[str]
    rows: list[list[str]]
    end: int  # index of the first line after the table
    local: str  # prose from the table's own heading to the table
    section: str  # prose from the enclosing "## " heading to the table

    def column(self, pattern: str) -> int:
        for i, cell in enumerate(self.header):
            if fnmatch.fnmatchcase(cell, pattern):
                return i
        raise TableError(f"{self.name}: no column {pattern!r} (header: {' | '.join(self.header)})")


@dataclass(frozen=True)
class Chart:
    """A PNG drawn from one or more tables; its link goes under the last of them."""

    name: str
    doc: str  # README.md or RESULTS.md, in the docs folder
    tables: tuple[tuple[str, tuple[str, ...]], ...]  # (heading prefix, header cell patterns)
    title: str
    extract: Callable[[list[Table]], dict]
    plot: Callable[[object, dict], None]
    height: float = 4.5  # inches; 450 px
    notes: tuple[str, ...] = field(default=())  # regexes read from the table's own section for the subtitle


# ---------------------------------------------------------------- parsing


def clean(cell: str) -> str:
    """A cell without Markdown emphasis or code marks."""
    return " ".join(cell.replace("**", "").replace("`", "").split())


def number(cell: str) -> float | None:
    """The figure a cell starts with ("1,103" -> 1103, "0.340 / 0.305" -> 0.340, "–" -> None)."""
    match = NUMBER.match(re.sub(r"(?<=\d),(?=\d{3}\b)", "", clean(cell)))
    return float(match.group()) if match else None


def split_row(line: str) -> list[str]:
    return [clean(c) for c in line.strip().strip("|").split("|")]


def headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every heading outside fenced code."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#{1,6})\s+(.*)", line)):
            out.append((i, len(m.group(1)), clean(m.group(2))))
    return out


def tables_in(lines: list[str], start: int, stop: int) -> list[tuple[int, int]]:
    """(first, end) line ranges of the Markdown tables in lines[start:stop]."""
    found, i = [], start
    while i < stop:
        if lines[i].lstrip().startswith("|") and i + 1 < stop and re.match(r"\s*\|?\s*:?-{3,}", lines[i + 1]):
            j = i + 2
            while j < stop and lines[j].lstrip().startswith("|"):
                j += 1
            found.append((i, j))
            i = j
        else:
            i += 1
    return found


def prose(lines: list[str], start: int, stop: int) -> str:
    return " ".join(line.strip() for line in lines[start:stop])


def find_table(text: str, doc: str, heading: str, header: tuple[str, ...]) -> Table:
    """The first table under `heading` (a prefix of the heading's text) whose header starts with `header`."""
    lines = text.splitlines()
    marks = headings(lines)
    name = f"{doc} '{heading}' table [{' | '.join(header)}]"
    for n, (at, level, title) in enumerate(marks):
        if not title.startswith(heading):
            continue
        stop = next((i for i, _, _ in marks[n + 1:]), len(lines))
        for first, end in tables_in(lines, at + 1, stop):
            cells = split_row(lines[first])
            if len(cells) >= len(header) and all(fnmatch.fnmatchcase(c, p) for c, p in zip(cells, header)):
                top = max((i for i, lvl, _ in marks[: n + 1] if lvl <= 2), default=0)
                rows = [split_row(line) for line in lines[first + 2:end]]
                return Table(name, cells, rows, end, prose(lines, at, first), prose(lines, top, first))
        raise TableError(f"{name}: no such table under the heading")
    raise TableError(f"{name}: no heading starting with {heading!r}")


def machine(text: str, table: Table) -> str:
    """The machine the table says it was measured on: its section's "Machine:", else the document's."""
    found = re.search(r"Machine: ([^;.]+(?:\.\d[^;.]*)?)", table.section)
    if found:
        return found.group(1).strip()
    lines = text.splitlines()
    preamble = prose(lines, 0, next((i for i, lvl, _ in headings(lines) if lvl == 2), len(lines)))
    found = re.search(r"(?:Machine|measured on a quiet machine): (.+?)(?:[,;] Python|;|$)", preamble)
    return found.group(1).strip().rstrip(",") if found else ""


def subtitle(chart: Chart, text: str, tables: list[Table], note: str = "") -> str:
    parts = [machine(text, tables[-1])]
    load = re.search(r"load(?: average)?(?: ≈)? (\d[\d.]*(?:[–-]\d[\d.]*)?)", tables[-1].local)
    parts.append(f"load average {load.group(1)}" if load else "")
    for pattern in chart.notes:
        found = re.search(pattern, tables[-1].local, re.IGNORECASE)
        parts.append(found.group(0).lower() if found else "")
    parts.append(note)
    return "; ".join(p for p in parts if p)


# ---------------------------------------------------------------- extraction


def label(cell: str) -> str:
    """A row label without its parenthetical remarks ("keyword index (load the saved index)" -> ...)."""
    return re.sub(r"\s*\([^)]*\)", "", cell).strip() or cell


def by_rows(table: Table, columns: list[str], keep_paren: bool = True) -> dict:
    """Categories = rows, one series per column; rows without any figure are listed as skipped."""
    idx = [table.column(c) for c in columns]
    labels, series, skipped = [], {table.header[i]: [] for i in idx}, []
    for row in table.rows:
        values = [number(row[i]) if i < len(row) else None for i in idx]
        if all(v is None for v in values):
            skipped.append(label(row[0]))
            continue
        labels.append(row[0] if keep_paren else label(row[0]))
        for i, v in zip(idx, values):
            series[table.header[i]].append(v)
    if not labels:
        raise TableError(f"{table.name}: no row holds figures in {columns}")
    return {"labels": labels, "series": series, "skipped": skipped}


def by_columns(table: Table, columns: list[str]) -> dict:
    """Categories = columns, one series per row (the row's first cell names it)."""
    idx = [table.column(c) for c in columns]
    series = {label(row[0]): [number(row[i]) if i < len(row) else None for i in idx] for row in table.rows}
    if not any(v is not None for vals in series.values() for v in vals):
        raise TableError(f"{table.name}: no figures in columns {columns}")
    return {"labels": [table.header[i] for i in idx], "series": series, "skipped": []}


def skipped_note(data: dict) -> dict:
    if data["skipped"]:
        data["note"] = "not measured: " + ", ".join(data["skipped"])
    return data


def results_rows(table: Table, benchmark: str) -> dict[str, str]:
    """metric -> value of one benchmark in RESULTS.md's three-column table."""
    rows = {r[1]: r[2] for r in table.rows if len(r) >= 3 and r[0] == benchmark}
    if not rows:
        raise TableError(f"{table.name}: no rows for benchmark {benchmark!r}")
    return rows


def figure(rows: dict[str, str], key: str, table: Table) -> float:
    value = number(rows.get(key, ""))
    if value is None:
        raise TableError(f"{table.name}: no figure for {key!r}")
    return value


def x_scifact(tables: list[Table]) -> dict:
    return skipped_note(by_rows(tables[0], ["nDCG@10", "Recall@10", "MRR@10"]))


def x_test_pools(tables: list[Table]) -> dict:
    return by_rows(tables[0], tables[0].header[1:])


def x_ece(tables: list[Table]) -> dict:
    return by_rows(tables[0], ["semantic", "keyword", "hybrid"])


def x_docsqa_ece(tables: list[Table]) -> dict:
    return by_columns(tables[0], ["SciFact", "NFCorpus", "CoSQA", "docs-QA"])


def x_query_latency(tables: list[Table]) -> dict:
    data = by_rows(tables[0], ["p50 ms", "p95 ms"])
    p50, p95 = data["series"].values()
    return {"labels": data["labels"], "series": {"p50 (median)": p50}, "ticks": {"p50 (median)": p95}}


def x_cli_latency(tables: list[Table]) -> dict:
    data = by_rows(tables[0], ["before", "after"], keep_paren=False)  # "torch imported: yes / no" has no time
    data["xlabel"] = "median milliseconds per stage (log scale)"
    return data


def x_scale_by_size(tables: list[Table]) -> dict:
    data = by_rows(tables[0], ["10k", "100k", "1M"])
    data["xlabel"] = "seconds (log scale)"
    return data


def x_latency_by_size(tables: list[Table]) -> dict:
    """p50 and p95 per mode at every corpus size run_all.py measured (query_latency <n>k chunks)."""
    table, labels, series, ticks = tables[0], [], {}, {}
    for row in table.rows:
        m = re.fullmatch(r"latency\.(.+)\.(p50|p95)_ms", row[1]) if len(row) >= 3 else None
        if not (row[0].startswith("query_latency") and m):
            continue
        size, mode, value = row[0].removeprefix("query_latency").strip(), m.group(1), number(row[2])
        if mode not in labels:
            labels.append(mode)
        target = series if m.group(2) == "p50" else ticks
        target.setdefault(size, {})[mode] = value
    if not series:
        raise TableError(f"{table.name}: no query_latency p50 rows")
    order = sorted(series, key=lambda s: number(s) or 0)
    return {"labels": labels, "series": {f"{s}, p50": [series[s].get(m) for m in labels] for s in order},
            "ticks": {f"{s}, p50": [ticks.get(s, {}).get(m) for m in labels] for s in order}}


def x_ingest(tables: list[Table]) -> dict:
    table = tables[0]
    rows = results_rows(table, "ingest")
    files, chunks = figure(rows, "files", table), figure(rows, "chunks", table)
    wall, encode, again = (figure(rows, k, table) for k in ("ingest_s", "encode_s", "reingest_s"))
    ratio, speedup = number(rows.get("ingest_over_encode", "")), number(rows.get("reingest_speedup", ""))
    return {"labels": ["first ingest (wall)", "embedding alone (encode)", "re-ingest, nothing changed"],
            "series": {"seconds": [wall, encode, again]},
            "title": f"Ingest of {files:,.0f} Markdown files ({chunks:,.0f} chunks)",
            "note": f"{chunks / wall:.1f} chunks/s; wall / encode {ratio or wall / encode:.2f}x; "
                    f"re-ingest {speedup or wall / again:,.0f}x faster"}


def x_toolgym(tables: list[Table]) -> dict:
    """hit@k per method, one panel per split (the split cell is blank on a split's later rows)."""
    table, split, panels = tables[0], "", {}
    cols = [table.column(c) for c in ("method", "hit@1", "hit@3", "hit@10")]
    for row in table.rows:
        split = label(row[0]) or split
        values = [number(row[i]) if i < len(row) else None for i in cols[1:]]
        if None in values:
            continue
        panel = panels.setdefault(split, {"labels": [], "series": {table.header[i]: [] for i in cols[1:]}})
        panel["labels"].append(row[cols[0]])
        for i, v in zip(cols[1:], values):
            panel["series"][table.header[i]].append(v)
    if not panels:
        raise TableError(f"{table.name}: no rows with hit@1 / hit@3 / hit@10")
    return {"panels": panels}


COST_COLUMNS = (("build s", "build (s)"), ("disk MB", "disk (MB)"),
                ("query p50*", "query p50 (ms)"), ("add+commit s", "add a 10-chunk document + commit (s)"))


def x_engine_costs(tables: list[Table]) -> dict:
    """One panel per cost, one series per corpus size; engines in the first table's order."""
    engines = [row[0] for row in tables[0].rows]
    panels = {}
    for pattern, title in COST_COLUMNS:
        series = {}
        for table in tables:
            col, values = table.column(pattern), {row[0]: row for row in table.rows}
            series[table.header[0]] = [number(values[e][col]) if e in values else None for e in engines]
        panels[title] = {"labels": engines, "series": series}
    return {"panels": panels}


# ---------------------------------------------------------------- drawing


def fmt(value: float) -> str:
    if value >= 100 or value.is_integer():
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2g}" if value < 1 else f"{value:.2f}".rstrip("0").rstrip(".")


def wrap(labels: list[str], width: int = LABEL_WRAP) -> list[str]:
    """Labels broken at spaces or after "_" (tool names like query_knowledge_base), never inside a word."""
    lines = (textwrap.wrap(s.replace("_", "_ "), width, break_long_words=False) for s in labels)
    return ["\n".join(line.replace("_ ", "_") for line in ls) or s for ls, s in zip(lines, labels)]


def vbars(ax, data: dict, ylabel: str, digits: int = 3, ymax: float | None = None, label_width: int = 18) -> None:
    """Grouped vertical bars, value on each bar."""
    labels, series = data["labels"], data["series"]
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        bars = ax.bar(xs, [float("nan") if v is None else v for v in values], width, label=name)
        ax.bar_label(bars, labels=["" if v is None else f"{v:.{digits}f}" for v in values], fontsize=7, padding=1)
    ax.set_xticks(range(len(labels)), wrap(labels, label_width), fontsize=8 if len(labels) * len(series) > 9 else 9)
    ax.set_ylabel(ylabel)
    top = max(v for vals in series.values() for v in vals if v is not None)
    ax.set_ylim(0, ymax if ymax is not None else top * 1.15)
    ax.grid(axis="y", alpha=0.3)


def hbars(ax, data: dict, xlabel: str, show_labels: bool = True) -> None:
    """Grouped horizontal bars on a log axis (values span 1 ms to seconds); optional p95 ticks."""
    labels, series, ticks = data["labels"], data["series"], data.get("ticks", {})
    height = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        ys = [i + (k - (len(series) - 1) / 2) * height for i in range(len(labels))]
        bars = ax.barh(ys, [float("nan") if not v else v for v in values], height, label=name)
        if name in ticks:
            p95_ticks(ax, ys, values, ticks[name], first=k == 0)
        else:
            ax.bar_label(bars, labels=["0" if v == 0 else "" if v is None else fmt(v) for v in values],
                         fontsize=7, padding=2)
    ax.set_xscale("log")
    ax.set_yticks(range(len(labels)), wrap(labels), fontsize=8)
    ax.tick_params(labelleft=show_labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    values = [v for vals in (*series.values(), *ticks.values()) for v in vals if v]
    ax.set_xlim(min(values) / 2, max(values) * 4)  # room for the value labels right of the longest bar
    ax.grid(axis="x", alpha=0.3, which="both")


def p95_ticks(ax, ys: list[float], p50: list[float | None], p95: list[float | None], first: bool) -> None:
    """A black tick at each p95 and "p50 / p95" right of it (a label at the bar's end would sit under it)."""
    ax.scatter([float("nan") if v is None else v for v in p95], ys, marker="|", s=90, color="black", zorder=3,
               label="p95" if first else None)
    for y, lo, hi in zip(ys, p50, p95):
        if lo is not None:
            text = fmt(lo) + (f" / {fmt(hi)}" if hi is not None else "")
            ax.text(max(lo, hi or 0) * 1.15, y, text, va="center", fontsize=7)


def legend(fig, ax, cols: int | None = None) -> None:
    handles, names = ax.get_legend_handles_labels()
    # one row holds ~100 characters of legend at 800 px; long variant names go two to a row
    cols = cols or (len(names) if sum(len(n) + 6 for n in names) < 100 else 2)
    fig.legend(handles, names, loc="outside lower center", ncol=cols, fontsize=8, frameon=False)


def p_quality(fig, data: dict) -> None:
    ax = fig.subplots()
    vbars(ax, data, "score, 0-1 (higher is better)", ymax=1.0)
    legend(fig, ax)


def p_ndcg(fig, data: dict) -> None:
    ax = fig.subplots()
    vbars(ax, data, "nDCG@10 (higher is better)")
    legend(fig, ax)


def p_ece(fig, data: dict) -> None:
    ax = fig.subplots()
    vbars(ax, data, "ECE, 10 bins (lower is better)")
    ax.axhline(ECE_GOAL, color="crimson", linestyle="--", linewidth=1,
               label=f"goal ≤ {ECE_GOAL:.2f} (SciFact, NFCorpus)")
    legend(fig, ax)


def p_latency(fig, data: dict) -> None:
    ax = fig.subplots()
    hbars(ax, data, data.get("xlabel", "milliseconds per query (log scale)"))
    legend(fig, ax)


def p_seconds(fig, data: dict) -> None:
    ax = fig.subplots()
    hbars(ax, data, "seconds (log scale)")


def p_toolgym(fig, data: dict) -> None:
    axes = fig.subplots(1, len(data["panels"]), sharey=True, squeeze=False)[0]
    for ax, (split, panel) in zip(axes, data["panels"].items()):
        vbars(ax, panel, "", digits=2, ymax=1.1, label_width=10)  # two panels: ~130 px per method
        ax.set_title(f"split: {split}", fontsize=9)
    axes[0].set_ylabel("share of real tasks with a correct tool in the top k")
    legend(fig, axes[0])


def p_costs(fig, data: dict) -> None:
    axes = list(fig.subplots(2, 2).flat)  # not sharey: every hbars call inverts its y axis
    for n, (ax, (title, panel)) in enumerate(zip(axes, data["panels"].items())):
        hbars(ax, panel, f"{title}, log scale", show_labels=n % 2 == 0)
        ax.xaxis.label.set_fontsize(9)
    legend(fig, axes[0])


# ---------------------------------------------------------------- charts

README, RESULTS = "README.md", "RESULTS.md"
RESULTS_TABLE = ("Benchmark results", ("benchmark", "metric", "value"))

CHARTS: tuple[Chart, ...] = (
    Chart("scifact_modes", README, (("SciFact (BEIR", ("mode", "nDCG@10", "Recall@10", "MRR@10")),),
          "SciFact test (300 queries): retrieval quality per mode", x_scifact, p_quality),
    Chart("test_pools_ndcg", README, (("Three public sets", ("test pool", "semantic", "keyword")),),
          "nDCG@10 on three test sets: single modes, old fusion, shipped adaptive fusion", x_test_pools, p_ndcg),
    Chart("calibration_ece", README,
          (("Calibration of relevance_score", ("set", "semantic", "keyword", "hybrid", "before coverage*")),),
          "Calibration of relevance_score: expected calibration error per mode (test splits)", x_ece, p_ece),
    Chart("docsqa_hybrid_ece", README,
          (("Calibration of relevance_score", ("hybrid, test", "SciFact", "NFCorpus", "CoSQA", "docs-QA")),),
          "Hybrid ECE per test set, per calibration variant", x_docsqa_ece, p_ece, height=5.0),
    Chart("query_latency_10k", README, (("Query latency, 10k chunks", ("mode", "p50 ms", "p95 ms")),),
          "Warm query latency, 10k chunks, one process (bars p50, ticks p95; labels p50 / p95 ms)",
          x_query_latency, p_latency, notes=(r"\d+ warm queries",)),
    Chart("cli_latency", README, (("CLI query latency", ("stage (median ms)", "before", "after")),),
          "CLI query in a new process, 10k chunks: median ms per stage", x_cli_latency, p_latency,
          height=5.0, notes=(r"medians of \d+ runs",)),
    Chart("query_latency_by_size", RESULTS, (RESULTS_TABLE,),
          "Warm query latency by corpus size (bars p50, ticks p95; labels p50 / p95 ms)",
          x_latency_by_size, p_latency, height=5.5),
    Chart("scale_by_size", "SCALE.md", (("Latency by corpus size", ("latency (s)", "10k", "100k", "1M")),),
          "Keyword search at 10k, 100k and 1M chunks (embedded store, seconds)", x_scale_by_size, p_latency),
    Chart("ingest", RESULTS, (RESULTS_TABLE,), "Ingest: first run, encode alone, unchanged re-run",
          x_ingest, p_seconds, height=3.0),
    Chart("toolgym_discovery", README,
          (("After issue 14", ("split", "method", "hit@1", "hit@3", "hit@10")),),
          "ToolGym catalog (~10,000 tools): hit@k per method", x_toolgym, p_toolgym),
    Chart("keyword_engine_costs", README,
          (("2. Costs", ("10k chunks", "build s")), ("2. Costs", ("100k chunks", "build s"))),
          "Keyword engines: costs at 10k and 100k chunks (lower is better)", x_engine_costs, p_costs, height=7.0),
)


def parse(chart: Chart, text: str) -> tuple[list[Table], dict]:
    tables = [find_table(text, chart.doc, heading, header) for heading, header in chart.tables]
    return tables, chart.extract(tables)


def render(chart: Chart, text: str, out: Path) -> Path:
    """Parse the chart's tables from `text` and write out/<name>.png (800 px wide)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables, data = parse(chart, text)
    fig = plt.figure(figsize=(WIDTH_IN, chart.height), dpi=DPI, layout="constrained")
    try:
        chart.plot(fig, data)
        sub = subtitle(chart, text, tables, data.get("note", ""))
        title = data.get("title", chart.title)
        fig.suptitle(title + ("\n" + "\n".join(textwrap.wrap(sub, 110)) if sub else ""), fontsize=10)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{chart.name}.png"
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return path


def link(chart: Chart, out: Path, docs: Path) -> str:
    folder = Path(os.path.relpath(out.resolve(), docs.resolve())).as_posix()
    return f"![{chart.title}]({folder}/{chart.name}.png)"


def insert_links(doc: Path, charts: list[Chart], out: Path) -> list[str]:
    """Put each chart's image link right under its table unless the document already has it.

    Re-reads the file just before writing: other people edit these documents too.
    """
    text = doc.read_text(encoding="utf-8")
    added = []
    for chart in charts:
        line = link(chart, out, doc.parent)
        if f"/{chart.name}.png)" in text:
            continue
        lines = text.splitlines()
        at = find_table(text, chart.doc, *chart.tables[-1]).end
        while at + 1 < len(lines) and not lines[at].strip() and lines[at + 1].startswith("!["):
            at += 2  # after the images already under this table, in chart order
        lines[at:at] = ["", line]
        text = "\n".join(lines) + "\n"
        added.append(chart.name)
    if added:
        doc.write_text(text, encoding="utf-8")
    return added


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only parse the charted tables; exit 1 if one is missing")
    ap.add_argument("--only", default=None, help="comma-separated chart names: " + ", ".join(c.name for c in CHARTS))
    ap.add_argument("--docs", type=Path, default=HERE, help="folder holding README.md and RESULTS.md")
    ap.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: <docs>/charts)")
    ap.add_argument("--no-links", action="store_true", help="do not add missing image links under the tables")
    args = ap.parse_args(argv)
    out = args.out or args.docs / "charts"
    wanted = set(args.only.split(",")) if args.only else {c.name for c in CHARTS}
    charts = [c for c in CHARTS if c.name in wanted]
    if unknown := wanted - {c.name for c in charts}:
        print(f"unknown chart(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    failed, drawn = run(charts, args.docs, out, args.check)
    if not args.check and not args.no_links:
        for doc in {c.doc for c in drawn}:
            for name in insert_links(args.docs / doc, [c for c in drawn if c.doc == doc], out):
                print(f"linked {name} under its table in {doc}")
    for message in failed:
        print(f"not charted: {message}", file=sys.stderr)
    return 1 if failed else 0


def run(charts: list[Chart], docs: Path, out: Path, check: bool) -> tuple[list[str], list[Chart]]:
    """(failure messages, charts drawn or checked); a bad table fails its chart only."""
    texts: dict[str, str | None] = {}
    failed, done = [], []
    for chart in charts:
        if chart.doc not in texts:
            path = docs / chart.doc
            texts[chart.doc] = path.read_text(encoding="utf-8") if path.is_file() else None
        text = texts[chart.doc]
        try:
            if text is None:
                raise TableError(f"{chart.doc} not found in {docs}")
            if check:
                parse(chart, text)
            else:
                print(render(chart, text, out))
            done.append(chart)
        except TableError as exc:
            failed.append(f"{chart.name}: {exc}")
    return failed, done


if __name__ == "__main__":
    sys.exit(main())
