"""Settings precedence and the documentation of every setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from research_agent.config import Settings, load_settings
from research_agent.errors import ConfigError

ROOT = Path(__file__).parents[1]


def _user_dotenv(text: str) -> Path:
    from research_agent.config import user_dotenv_file

    path = user_dotenv_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_precedence_flag_env_dotenv_file_default(monkeypatch, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("chroma_port: 1\nrerank_candidates: 11\nper_document_cap: 7\nmax_top_k: 50\nrrf_k: 5\n")
    _user_dotenv("RESEARCH_AGENT_CHROMA_PORT=2\nRESEARCH_AGENT_RERANK_CANDIDATES=22\nRESEARCH_AGENT_PER_DOCUMENT_CAP=8\n"
                 "RESEARCH_AGENT_RRF_K=6\n")
    Path(".env").write_text("RESEARCH_AGENT_RRF_K=9\n")  # the workspace .env: tuning only, over the user's
    monkeypatch.setenv("RESEARCH_AGENT_CHROMA_PORT", "3")
    monkeypatch.setenv("RESEARCH_AGENT_RERANK_CANDIDATES", "33")
    s = load_settings(cfg, chroma_port=4)
    assert (s.chroma_port, s.rerank_candidates, s.per_document_cap, s.max_top_k, s.max_query_chars, s.rrf_k) == (
        4, 33, 8, 50, 2000, 9)


WIDENING = {"transport": "http", "host": "0.0.0.0", "port": "1234", "auth_type": "bearer",
            "api_keys": "attacker-key-0123456789", "allowed_roots": "/", "store": "/tmp/elsewhere",
            "chroma_host": "evil.example", "log_file": "/tmp/elsewhere.log", "allowed_hosts": "*",
            "allowed_origins": "*", "embedding_model": "/tmp/evil-model", "max_file_mb": "100000",
            "discovery_boosts_file": "/etc/passwd", "hf_offline": "false"}


def test_a_workspace_dotenv_cannot_widen_what_is_exposed(monkeypatch, caplog):
    monkeypatch.delenv("RESEARCH_AGENT_STORE")  # the conftest's; the .env must not move the default either
    Path(".env").write_text("".join(f"RESEARCH_AGENT_{k.upper()}={v}\n" for k, v in WIDENING.items())
                            + "RESEARCH_AGENT_PER_DOCUMENT_CAP=1\n")
    defaults = Settings()
    with caplog.at_level("WARNING"):
        s = load_settings()
    for name in WIDENING:
        assert getattr(s, name) == getattr(defaults, name), name
    assert s.per_document_cap == 1  # ranking knobs may be tuned per workspace
    assert "RESEARCH_AGENT_API_KEYS" in caplog.text and "ignored" in caplog.text


def test_the_user_dotenv_is_trusted_but_files_never_choose_the_transport(monkeypatch, tmp_path, caplog):
    _user_dotenv("RESEARCH_AGENT_TRANSPORT=http\nRESEARCH_AGENT_HOST=0.0.0.0\nRESEARCH_AGENT_ALLOWED_ROOTS=/srv\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("transport: http\n")
    with caplog.at_level("WARNING"):
        s = load_settings(cfg)
    assert (s.transport, s.host, s.allowed_roots) == ("stdio", "0.0.0.0", [Path("/srv")])
    assert "transport" in caplog.text
    monkeypatch.setenv("RESEARCH_AGENT_TRANSPORT", "http")  # the launcher's environment decides
    assert load_settings(cfg).transport == "http"
    assert load_settings(cfg, transport="stdio").transport == "stdio"


def test_the_workspace_allow_list_names_real_settings():
    from research_agent.config import WORKSPACE_DOTENV_SETTINGS

    assert WORKSPACE_DOTENV_SETTINGS <= set(Settings.model_fields)
    assert not WORKSPACE_DOTENV_SETTINGS & set(WIDENING)


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


@pytest.mark.parametrize("name, value", [
    ("RRF_K", "-1"), ("RRF_K", "0"), ("LOG_LEVEL", "BOGUS"), ("CONTEXT_WEIGHT", "inf"), ("CONTEXT_WEIGHT", "nan"),
    ("THRESHOLD_RELEVANT", "nan"), ("THRESHOLD_RELEVANT", "-1"), ("THRESHOLD_HIGHLY_RELEVANT", "1.5"),
    ("RETRIEVAL_CANDIDATES", "-5"), ("RERANK_CANDIDATES", "0"), ("DISCOVERY_CANDIDATES", "-1"),
    ("SNIPPET_TOKENS", "0"), ("PER_DOCUMENT_CAP", "-1"), ("HYBRID_DENSE_WEIGHT", "nan"),
    ("DISCOVERY_MIN_SCORE", "-inf"), ("DISCOVERY_COLLAPSE_MAX_TOKENS", "-3"), ("KEYWORD_TITLE_WEIGHT", "-1"),
    ("RERANK_PASSAGE_TOKENS", "-1"), ("CALL_TIMEOUT", "0"), ("LOCK_TIMEOUT", "inf"), ("MAX_TOP_K", "0"),
    ("MAX_CONCURRENT_CALLS", "0"), ("CHUNK_MAX_TOKENS", "0"), ("MAX_FILE_MB", "-1"), ("PORT", "70000"),
    ("HTTP_BODY_TIMEOUT", "0"), ("EMBEDDING_BATCH_SIZE", "0"),
])
def test_nonsense_values_are_config_errors_naming_the_setting(monkeypatch, name, value):
    """workspace_env_dos.sh: RRF_K=-1 made every hybrid query divide by zero, LOG_LEVEL=BOGUS crashed the server
    with a traceback after `initialize`, and inf, nan or negative counts were accepted."""
    monkeypatch.setenv(f"RESEARCH_AGENT_{name}", value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert f"RESEARCH_AGENT_{name}" in str(caught.value), caught.value
    assert "RESEARCH_AGENT_" + name in caught.value.data["guidance"]


def test_thresholds_must_be_ordered(monkeypatch):
    monkeypatch.setenv("RESEARCH_AGENT_THRESHOLD_SOMEWHAT_RELEVANT", "0.9")
    with pytest.raises(ConfigError, match="THRESHOLD"):
        load_settings()
    monkeypatch.setenv("RESEARCH_AGENT_THRESHOLD_SOMEWHAT_RELEVANT", "0.1")
    assert load_settings().threshold_somewhat_relevant == 0.1


def test_sensible_values_still_load(monkeypatch):
    for name, value in {"RRF_K": "1", "LOG_LEVEL": "debug", "CONTEXT_WEIGHT": "0", "PER_DOCUMENT_CAP": "0",
                        "RERANK_PASSAGE_TOKENS": "0", "THRESHOLD_HIGHLY_RELEVANT": "1"}.items():
        monkeypatch.setenv(f"RESEARCH_AGENT_{name}", value)
    settings = load_settings()
    assert (settings.rrf_k, settings.log_level, settings.per_document_cap) == (1, "DEBUG", 0)


@pytest.fixture
def bare_home(tmp_path, monkeypatch):
    """A user with no store setting and no XDG_DATA_HOME, whose home is a fresh folder."""
    home = tmp_path / "bare-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.delenv("RESEARCH_AGENT_STORE")
    return home


@pytest.fixture
def on_macos(monkeypatch):
    """platformdirs as it answers on macOS (its real MacOS class, which only expands `~`)."""
    import platformdirs
    from platformdirs.macos import MacOS

    monkeypatch.setattr(platformdirs, "user_data_path",
                        lambda appname=None, appauthor=None, *a, **k: MacOS(appname, appauthor).user_data_path)


def test_the_default_store_is_the_os_data_folder_for_a_new_user(bare_home, on_macos):
    assert load_settings().store == bare_home / "Library" / "Application Support" / "research-agent" / "store"


def test_an_existing_store_in_the_old_place_is_kept_on_upgrade(bare_home, on_macos):
    """Earlier releases put the store in ~/.local/share on every OS: upgrading must not hide it behind a new,
    empty folder."""
    old = bare_home / ".local" / "share" / "research-agent" / "store"
    old.mkdir(parents=True)
    assert load_settings().store == old


def test_explicit_store_settings_win_over_the_os_default(bare_home, on_macos, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert load_settings().store == tmp_path / "xdg" / "research-agent" / "store"
    monkeypatch.setenv("RESEARCH_AGENT_STORE", str(tmp_path / "mine"))
    assert load_settings().store == tmp_path / "mine"
    assert load_settings(store=tmp_path / "flag").store == tmp_path / "flag"


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="the Linux folder")
def test_on_linux_the_default_store_stays_where_it_always_was(bare_home):
    assert load_settings().store == bare_home / ".local" / "share" / "research-agent" / "store"


@pytest.mark.parametrize("where", ["workspace", "user"])
def test_a_dotenv_that_is_not_utf8_is_a_config_error_naming_the_file(where):
    """A `.env` holding bytes that are not UTF-8 (a file saved in another encoding) is a ConfigError naming the
    file, never an "Unexpected failure (UnicodeDecodeError)" (the attack pass: the MCP server died with its
    requests unanswered; the CLI's status failed the same way)."""
    path = Path(".env") if where == "workspace" else _user_dotenv("")
    path.write_bytes(b"RESEARCH_AGENT_LOCK_TIMEOUT=\xff\xfe\n")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(path.resolve()) in str(err.value) or str(path) in str(err.value)
    assert "UTF-8" in str(err.value) and "UTF-8" in err.value.data["guidance"]


@pytest.mark.parametrize("where", ["flag", "config file"])
def test_an_empty_store_setting_is_a_config_error_not_the_working_directory(tmp_path, where):
    """`--store "$STORE"` with STORE unset (or `store: ""` in a config file) meant the working directory: a
    `collections create` wrote a Chroma store into the checkout. Now: exit 3, a coded error naming the setting,
    nothing written. (An empty RESEARCH_AGENT_STORE stays unset, as every empty variable is.)"""
    import json
    import subprocess
    import sys

    work = tmp_path / "checkout"
    work.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    args = ["--store", ""] if where == "flag" else ["--config", str(tmp_path / "c.yaml")]
    (tmp_path / "c.yaml").write_text('store: ""\n', encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "research_agent", "--json", *args, "collections", "create", "notes"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    error = json.loads(proc.stderr.strip().splitlines()[-1])["error"]
    assert error["type"] == "ConfigError" and error["code"] == -32001 and "store" in error["message"].lower(), error
    assert "Traceback" not in proc.stderr
    assert list(work.iterdir()) == [] and not (tmp_path / "data").exists()


@pytest.mark.parametrize("args, needle", [
    (["--chroma-host", ""], "--chroma-host"),
    (["--chroma-host", " "], "--chroma-host"),
    (["--chroma-host", "http://127.0.0.1"], "no scheme"),
    (["--chroma-host", "127.0.0.1:8000"], "--chroma-port"),
    (["--chroma-host", "[::1]:8000"], "--chroma-port"),
    (["--config", ""], "--config"),
    (["--config", "."], "--config"),
    (["--store", "~nosuchuser-here/x"], "--store"),
    (["serve", "--transport", "http", "--host", ""], "--host"),
])
def test_flags_that_name_nothing_usable_are_config_errors(tmp_path, args, needle):
    """Attack pass of 2026-11-25: `--chroma-host ''` silently used the embedded default store (a collection created
    there); a scheme or port in the host made `http://http://x:8000`; `--config ''` (Typer's Path(".")) and a
    folder exited 1 (IsADirectoryError); `~nosuchuser` exited 1 (RuntimeError). Each is now exit 3, a coded error
    naming the flag, and nothing written."""
    import json
    import os
    import subprocess
    import sys

    work = tmp_path / "checkout"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    command = args if args[0] == "serve" else [*args, "collections", "create", "notes"]
    proc = subprocess.run([sys.executable, "-m", "research_agent", "--json", *command],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    error = json.loads(proc.stderr.strip().splitlines()[-1])["error"]
    assert error["type"] == "ConfigError" and needle in error["message"] + error["data"]["guidance"], error
    assert list(work.iterdir()) == [] and not (tmp_path / "data").exists()


@pytest.mark.parametrize("text", ["store:\n", "store: ~\n", "store: null\n"])
def test_a_null_store_in_a_config_file_means_the_default(monkeypatch, tmp_path, text):
    """YAML's null (`store:` left blank) is the setting left out: the default store, not a ValidationError."""
    from research_agent.config import default_store_path

    monkeypatch.delenv("RESEARCH_AGENT_STORE", raising=False)
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    assert load_settings(tmp_path / "c.yaml").store == default_store_path()
