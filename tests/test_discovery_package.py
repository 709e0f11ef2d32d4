"""The discovery package's shape: its public names, its packaged boost file, and a light import."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The names the CLI (research_agent/cli/discover.py), the MCP server and the benchmarks import from
# research_agent.discovery; the package split must keep every one importable from the package itself.
CALLER_NAMES = (
    "discover_context", "retrieve_knowledge", "list_knowledge_bases", "search_knowledge", "get_dependencies",
    "read_knowledge_resource", "list_knowledge_resources", "task_preparation_prompt", "knowledge_audit_prompt",
    "load_boosts", "TASK_TYPES", "Node", "NodeIndex", "DiscoveryResult", "Recommendation", "RetrievalResult",
    "KnowledgeNode", "KnowledgeBaseList", "DependencyGraph",
)


def test_callers_names_are_exported_by_the_package():
    from research_agent import discovery

    missing = [name for name in CALLER_NAMES if not hasattr(discovery, name)]
    assert missing == []
    assert set(discovery.__all__) <= set(dir(discovery))


def test_boosts_file_is_package_data_of_its_package():
    """A wheel without task_boosts.yaml fails every discover_context call with a FileNotFoundError."""
    from research_agent.discovery import BOOSTS_FILE

    assert BOOSTS_FILE.is_file()
    package_dir = BOOSTS_FILE.parent.relative_to(ROOT)
    package = ".".join(package_dir.parts)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = data["tool"]["setuptools"]["package-data"].get(package, [])
    assert any(fnmatch.fnmatch(BOOSTS_FILE.name, g) for g in globs), (package, globs)


def test_importing_discovery_loads_no_heavy_library():
    """The MCP handshake imports the package; numpy, yaml, the stemmer and torch load on first use only."""
    code = ("import sys, research_agent.discovery; "
            "print(sorted(m for m in ('numpy', 'yaml', 'Stemmer', 'torch', 'chromadb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
