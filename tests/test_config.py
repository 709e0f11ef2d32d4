"""Settings precedence and the documentation of every setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from research_agent.config import Settings, load_settings
from research_agent.errors import ConfigError

ROOT = Path(__file__).parents[1]


def test_precedence_flag_env_dotenv_file_default(monkeypatch, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("chroma_port: 1\nrerank_candidates: 11\nper_document_cap: 7\nmax_top_k: 50\n")
    Path(".env").write_text("RESEARCH_AGENT_CHROMA_PORT=2\nRESEARCH_AGENT_RERANK_CANDIDATES=22\nRESEARCH_AGENT_PER_DOCUMENT_CAP=8\n")
    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_PORT", "3")
    monkeypatch.setenv("RESEARCH_AGENT_RERANK_CANDIDATES", "33")
    s = load_settings(cfg, chroma_port=4)
    assert (s.chroma_port, s.rerank_candidates, s.per_document_cap, s.max_top_k, s.max_query_chars) == (4, 33, 8, 50, 2000)


def test_bad_settings_are_config_errors(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("chroma_port: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)
    bad.write_text("no_such_setting: 1\n")
    with pytest.raises(ConfigError, match="no_such_setting"):
        load_settings(bad)
    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_PORT", "not-a-number")
    with pytest.raises(ConfigError, match="chroma_port"):
        load_settings()


def test_every_setting_is_in_env_example():
    documented = set(re.findall(r"RESEARCH_AGENT_([A-Z_]+)=", (ROOT / ".env.example").read_text()))
    expected = {name.upper() for name in Settings.model_fields}
    assert expected - documented == set(), "document these settings in .env.example"
    assert documented - expected == set(), ".env.example names settings that do not exist"
