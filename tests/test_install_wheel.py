"""The wheel installs into a fresh virtualenv and both faces start from it: the CLI and the MCP server over stdio
(`research-agent serve`), with no checkout on sys.path and nothing downloaded.

The fresh environment takes its dependencies from the checkout's .venv through a path line in a `.pth` file (a
venv made with `--system-site-packages` would see the base interpreter's packages, not .venv's); only the path
is added, so .venv's editable install of this checkout (its `.pth` finder) is not active there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from test_client_configs import _isolated_env, _session

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build offline: no build isolation, so the setuptools already in .venv builds it (no download)."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    # From a copy: setuptools writes build/ and *.egg-info next to the sources, and others test this checkout.
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "research_agent", source / "research_agent",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out),
          str(source)], cwd=out)
    (found,) = out.glob("research_agent_kb-*.whl")
    return found


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # Every site folder the test interpreter sees (its venv's, and any a .pth of its own adds).
    deps = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (site / "zz_checkout_venv_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    # --no-index: the dependencies must resolve against what is installed (the .pth above), never a download.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", str(wheel)])
    return env_dir


def _clean_env(tmp_path: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, **_isolated_env(tmp_path)}


def test_the_wheel_carries_the_license_and_no_top_level_mcp_server(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"research_agent", f"{wheel.name.split('-py3')[0]}.dist-info"}
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "Name: research-agent-kb" in metadata and "License-Expression: MIT" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert any(n.endswith("search/calibration.json") for n in names)  # package data ships


def test_the_installed_cli_starts_and_reports_status(fresh_venv, tmp_path):
    exe, python = fresh_venv / "bin" / "research-agent", fresh_venv / "bin" / "python"
    env = _clean_env(tmp_path)
    where = _run([str(python), "-c", "import research_agent, importlib.util as u; print(research_agent.__file__); "
                  "print(u.find_spec('mcp_server'))"], cwd=tmp_path, env=env).stdout.split()
    assert where[0].startswith(str(fresh_venv)), where  # the installed copy, not the checkout
    assert where[1] == "None"  # no top-level `mcp_server` module (it would clash with PyPI's mcp-server)
    assert "collections" in _run([str(exe), "--help"], cwd=tmp_path, env=env).stdout
    status = json.loads(_run([str(exe), "--json", "status"], cwd=tmp_path, env=env, timeout=120).stdout)
    assert (status["store_kind"], Path(status["store_location"]), status["store_reachable"]) == (
        "embedded", tmp_path / "store", True), status


def test_the_installed_mcp_server_answers_tools_list_over_stdio(fresh_venv, tmp_path):
    entry = {"command": str(fresh_venv / "bin" / "research-agent"), "args": ["serve"], "env": {},
             "cwd": str(tmp_path)}

    async def body(session: Any) -> set[str]:
        return {t.name for t in (await session.list_tools()).tools}

    tools = anyio.run(_session, entry, _clean_env(tmp_path), body)
    assert {"query_knowledge_base", "ingest_documents", "get_status"} <= tools
