"""Boosts: the task_type x node type matrix, status, recency and proximity multipliers on a node's odds.

The shipped values live in task_boosts.yaml next to this module (package data); a user file named by
the discovery_boosts_file setting is merged over them key by key, so it only needs the keys it
changes. Every boost is a positive number and multiplies the odds (1.0 = no change), so boosts
reorder and nudge but cannot carry an unrelated node past the 0.5 line (ranking.py has the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from research_agent.discovery.analysis import parse_date
from research_agent.discovery.node_index import Node
from research_agent.errors import ConfigError
from research_agent.text import content_terms as terms

if TYPE_CHECKING:
    from research_agent.container import Container

BOOSTS_FILE = Path(__file__).with_name("task_boosts.yaml")

_boost_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def load_boosts(path: Path | str | None = None) -> dict[str, Any]:
    """The packaged boost file, overlaid with the user's file (keys left out keep the defaults)."""
    import yaml

    data = yaml.safe_load(BOOSTS_FILE.read_text(encoding="utf-8"))
    if path:
        p = Path(path).expanduser()
        data = _merge(data, _read_user_file(p))
        bad = [key for key, value in _leaves(data) if isinstance(value, bool) or not isinstance(value, (int, float))
               or value <= 0]
        if bad:
            raise ConfigError(f"The discovery boosts file {p} has values that are not positive numbers: "
                              f"{', '.join(bad[:5])}", guidance="Every boost is a positive number (1.0 = no change).")
    return data


def _read_user_file(p: Path) -> dict[str, Any]:
    import yaml

    try:
        user = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"Cannot read the discovery boosts file {p}: {exc.strerror}",
                          guidance="Fix RESEARCH_AGENT_DISCOVERY_BOOSTS_FILE or remove it.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"The discovery boosts file {p} is not valid YAML: {exc}",
                          guidance="Fix the YAML syntax (see research_agent/discovery/task_boosts.yaml).") from None
    if not isinstance(user, dict):
        raise ConfigError(f"The discovery boosts file {p} must hold a mapping",
                          guidance="Start from a copy of research_agent/discovery/task_boosts.yaml.")
    return user


def _leaves(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), data)]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def boosts_for(c: Container) -> dict[str, Any]:
    """The merged boosts for the container's settings, re-read when the user file's mtime changes."""
    path = c.settings.discovery_boosts_file
    key = str(path or "")
    mtime = Path(path).expanduser().stat().st_mtime if path and Path(path).expanduser().exists() else 0.0
    hit = _boost_cache.get(key)
    if hit and hit[0] == mtime:
        return hit[1]
    data = load_boosts(path)
    _boost_cache[key] = (mtime, data)
    return data


@dataclass
class BoostRules:
    """The boost file resolved for one discover_context call: what multiplies a node's odds, and why."""

    boosts: dict[str, Any]
    task_type: str | None
    current_file: str | None
    newest: date | None  # the newest last_checked over the searched collections

    def __post_init__(self) -> None:
        b = self.boosts
        self.row = b.get("task_types", {}).get(self.task_type or "", {}) if self.task_type else {}
        self.default_boost = float(b.get("default", 1.0))
        self.status = {str(k).lower(): float(v) for k, v in (b.get("status") or {}).items()}
        self.recency = b.get("recency", {})

    def factors(self, node: Node) -> list[tuple[str, float]]:
        """(reason label, multiplier) for each boost that applies to `node`, in the order reasons list them."""
        out: list[tuple[str, float]] = []
        if self.task_type:
            b = float(self.row.get(node.eff_type or "", self.default_boost))
            out.append((f"{node.eff_type or 'untyped'} x{b:g} for {self.task_type}", b))
        if node.eff_status:
            out.append((f"status {node.eff_status}", self.status.get(node.eff_status.lower(), 1.0)))
        recency = self._recency(node)
        if recency:
            out.append(recency)
        prox = proximity(node, self.current_file, self.boosts)
        if prox:
            out.append(prox)
        return out

    def _recency(self, node: Node) -> tuple[str, float] | None:
        checked = parse_date(node.eff_last_checked)
        if not (checked and self.newest):
            return None
        age = (self.newest - checked).days
        rec = self.recency
        if age <= int(rec.get("fresh_days", 120)):
            return "recently checked", float(rec.get("fresh", 1.0))
        if age > int(rec.get("stale_days", 365)):
            return f"last checked {checked.isoformat()}", float(rec.get("stale", 1.0))
        return None


def _suffix_match(a: PurePosixPath, b: PurePosixPath) -> bool:
    n = min(len(a.parts), len(b.parts))
    return n > 0 and a.parts[-n:] == b.parts[-n:]


def proximity(node: Node, current_file: str | None, boosts: dict[str, Any]) -> tuple[str, float] | None:
    """The proximity boost of `node` to the file the caller is working on: same file, directory or path words."""
    if not current_file:
        return None
    prox = boosts.get("proximity", {})
    cur = PurePosixPath(str(current_file).replace("\\", "/").lstrip("./"))
    src = PurePosixPath(node.source_document)
    # Document keys are relative to the ingested folder's parent and current_file to the workspace:
    # compare by path suffix, so `repo/docs/a.md` and `docs/a.md` are the same file.
    if _suffix_match(cur, src):
        return "same file as current_file", float(prox.get("same_file", 1.0))
    if len(cur.parts) > 1 and len(src.parts) > 1 and _suffix_match(cur.parent, src.parent):
        return "same directory as current_file", float(prox.get("same_directory", 1.0))
    names = set(terms(" ".join(list(cur.parent.parts[-3:]) + [cur.stem])))
    node_words = set(terms(" ".join([node.source_document, node.header_path, " ".join(node.labels)])))
    if names & node_words:
        return f"path of current_file mentions {', '.join(sorted(names & node_words)[:2])}", \
            float(prox.get("path_terms", 1.0))
    return None
