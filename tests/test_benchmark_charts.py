"""benchmarks/charts.py: the charted tables parse on the repository's own documents, a chart is a real
800-px PNG drawn from a table's figures, and a missing table is reported by name (exit 1), not a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "charts.py"

LATENCY_DOC = """# Benchmarks

Every figure below was measured on a quiet machine: 2-core test box, 8 GiB, Python 3.11.

### Query latency, 10k chunks

| mode | p50 ms | p95 ms | median per stage (ms) |
|---|---|---|---|
| semantic | 38 | 45 | embed 15 |
| keyword | 5 | 7 | |
| hybrid + rerank 20, whole chunks | 1,103 | **1,472** | |

Text after the table.
"""


def load_charts():
    spec = importlib.util.spec_from_file_location("bench_charts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_charts"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_check_finds_every_charted_table_in_the_repository():
    proc = run_script("--check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_a_chart_is_an_800px_png_of_its_tables_figures(tmp_path):
    charts = load_charts()
    chart = next(c for c in charts.CHARTS if c.name == "query_latency_10k")
    _, data = charts.parse(chart, LATENCY_DOC)
    assert data["labels"] == ["semantic", "keyword", "hybrid + rerank 20, whole chunks"]
    assert list(data["series"].values()) == [[38.0, 5.0, 1103.0]]  # medians are the bars
    assert list(data["ticks"].values()) == [[45.0, 7.0, 1472.0]]

    path = charts.render(chart, LATENCY_DOC, tmp_path)
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (800, 450)
        assert len(image.convert("L").getcolors(256)) > 10  # drawn, not a blank canvas


def test_cells_give_their_leading_figure_only():
    charts = load_charts()
    assert charts.number("**1,103**") == 1103.0
    assert charts.number("0.340 / 0.305") == 0.340
    assert charts.number("2,574 (fetch from Chroma + BM25 build)") == 2574.0
    assert charts.number("–") is None
    # a model name is not a figure: the unavailable rerank row of the SciFact table is skipped
    assert charts.number("unavailable offline: ms-marco-MiniLM-L6-v2") is None


def test_a_missing_table_is_named_and_the_others_still_drawn_and_linked_once(tmp_path):
    (tmp_path / "README.md").write_text(LATENCY_DOC, encoding="utf-8")
    args = ("--docs", str(tmp_path), "--only", "query_latency_10k,cli_latency")
    first = run_script(*args)
    assert first.returncode == 1
    assert "Traceback" not in first.stderr
    assert "cli_latency" in first.stderr and "CLI query latency" in first.stderr
    assert (tmp_path / "charts" / "query_latency_10k.png").is_file()
    assert not (tmp_path / "charts" / "cli_latency.png").exists()

    lines = (tmp_path / "README.md").read_text(encoding="utf-8").splitlines()
    last_row = lines.index("| hybrid + rerank 20, whole chunks | 1,103 | **1,472** | |")
    assert lines[last_row + 1] == ""
    assert lines[last_row + 2].startswith("![") and lines[last_row + 2].endswith("(charts/query_latency_10k.png)")
    assert "Text after the table." in lines

    run_script(*args)  # a re-run keeps one link per chart
    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert text.count("(charts/query_latency_10k.png)") == 1
