"""Cross-encoder reranking behind one interface; lazily loaded once per process, under a lock."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from research_agent import embeddings
from research_agent.config import Settings
from research_agent.embeddings import load_model, resolve_model
from research_agent.errors import ResearchAgentError

log = logging.getLogger(__name__)

_cache: dict[tuple[str, str, str, int, str], "Reranker"] = {}
_cache_lock = threading.Lock()


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, x))))


class Reranker:
    """Scores (query, passage) pairs in 0..1; `available` is False (with `error`) if the model cannot load."""

    def __init__(self, settings: Settings) -> None:
        self.model_name = settings.reranker_model
        self.backend = settings.reranker_backend
        self._settings = settings
        self._model: Any = None
        self.available: bool | None = None  # None: not tried yet
        self.error: str | None = None
        self.precision: str | None = None  # float32 | bfloat16, decided when the model loads
        self._retry_at: float | None = None  # when a retryable failure (hub unreachable) may be tried again
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> bool:
        """Load once; False (with `error`) if the model cannot load. A retryable failure (the hub did not
        answer) is tried again after HUB_RETRY_SECONDS, so a long-running server picks the model up later."""
        with self._lock:
            if self._retry_at is not None and time.monotonic() >= self._retry_at:
                self.available, self.error, self._retry_at = None, None, None
            if self.available is not None:
                return self.available
            try:
                source = resolve_model(self.model_name, self._settings)
                self._model = load_model(source, self._settings, self._load)
                self.precision = resolve_precision(self._settings.rerank_precision, self._settings.device)
                self.available = True
            except Exception as exc:
                log.info("reranker %s unavailable: %s", self.model_name, exc)
                self.error = _describe(exc)
                self.available = False
                if getattr(exc, "retryable", False):
                    self._retry_at = time.monotonic() + embeddings.HUB_RETRY_SECONDS
            return self.available

    def _load(self, target: str, local_only: bool) -> Any:
        """The backend's model. FlagReranker has no local_files_only, but a local-only target is a folder."""
        if self.backend == "flagembedding":
            from FlagEmbedding import FlagReranker

            model = FlagReranker(target, use_fp16=False, devices=self._settings.device)
            labels = getattr(getattr(model.model, "config", None), "num_labels", 1)
            if labels != 1:
                # FlagReranker flattens the logits of every pair into one list, mixing up 2-label models.
                raise ValueError(f"the flagembedding backend needs a one-logit model ({labels} labels); "
                                 "use reranker_backend=sentence-transformers")
            return model
        from sentence_transformers import CrossEncoder

        return CrossEncoder(target, device=self._settings.device, max_length=self._settings.rerank_max_length,
                            local_files_only=local_only)

    def raw_scores(self, query: str, passages: list[str]) -> Any:
        """The model's logits: one per passage, or a row of logits per passage for multi-label models."""
        import torch

        pairs = [(query, p) for p in passages]
        batch = self._settings.rerank_batch_size
        with torch.autocast(self._settings.device.split(":")[0], dtype=torch.bfloat16,
                            enabled=self.precision == "bfloat16"):
            if self.backend == "flagembedding":
                scores = self._model.compute_score(pairs, batch_size=batch,
                                                   max_length=self._settings.rerank_max_length, normalize=False)
                return [float(s) for s in (scores if isinstance(scores, list) else [scores])]
            out = self._model.predict(pairs, batch_size=batch, activation_fn=torch.nn.Identity(),
                                      show_progress_bar=False)
        return [[float(v) for v in row] if isinstance(row, list) else float(row)
                for row in (out.tolist() if hasattr(out, "tolist") else list(out))]

    def score(self, query: str, passages: list[str]) -> list[float] | None:
        """Relevance in 0..1 for each passage, or None if unavailable.

        One-logit models (ms-marco cross-encoders, BGE rerankers): the sigmoid of the logit. Two-logit
        models (not relevant, relevant): the softmax probability of the second class. Either way the
        label thresholds mean the same across models and backends.
        """
        if not passages or not self.load():
            return None
        return normalise_scores(self.raw_scores(query, passages))


def _describe(exc: Exception) -> str:
    """One line for warnings and status: our errors say the cause themselves; others get their type name."""
    if isinstance(exc, ResearchAgentError):
        return exc.message
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def resolve_precision(setting: str, device: str) -> str:
    """`auto` is bfloat16 on a CPU that computes it natively (AVX512-BF16 or AMX: 1.6-1.8x faster than
    float32 here, scores within about 0.003), float32 elsewhere; an explicit float32 or bfloat16 is kept."""
    if setting != "auto":
        return setting
    if device != "cpu":
        return "float32"
    import torch

    try:
        return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return "float32"


def normalise_scores(raw: Any) -> list[float]:
    out = []
    for row in raw:
        if isinstance(row, (list, tuple)):
            if len(row) == 1:
                out.append(_sigmoid(float(row[0])))
            else:  # softmax, probability of the last ("relevant") class
                hi = max(row)
                exps = [math.exp(float(v) - hi) for v in row]
                out.append(exps[-1] / sum(exps))
        else:
            out.append(_sigmoid(float(row)))
    return out


def get_reranker(settings: Settings) -> Reranker:
    key = (settings.reranker_backend, settings.reranker_model, settings.device, settings.rerank_max_length,
           settings.rerank_precision)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = Reranker(settings)
        return _cache[key]
