"""Cross-encoder reranking behind one interface; lazily loaded once per process, under a lock."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from research_agent import embeddings, numpy_encoder
from research_agent.config import Settings
from research_agent.embeddings import load_model, resolve_model
from research_agent.errors import ResearchAgentError

log = logging.getLogger(__name__)

#: Score with numpy_encoder.NumpyCrossEncoder when the model is a local one-label BERT cross-encoder in float32
#: safetensors (the default ms-marco-MiniLM-L6-v2 once cached) on CPU. Why: CrossEncoder imports torch and
#: sentence-transformers, +4-9 s for every reranked CLI query in a new process; numpy loads the model in ~0.1 s
#: and scores 20 passages of 96 tokens in 0.7-1.3 s on 2 busy cores, as torch float32 did (1.2-1.3 s), with
#: logits within 1e-6. A long-lived server on a CPU that computes bfloat16 natively keeps torch in bfloat16
#: (1.6-1.8x faster than float32 once loaded; see `_numpy_model`). A setting candidate; False restores
#: CrossEncoder for every model.
NUMPY_RERANKER = True

_cache: dict[tuple[str, str, str, int, str, bool], "Reranker"] = {}
_cache_lock = threading.Lock()


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, x))))


class Reranker:
    """Scores (query, passage) pairs in 0..1; `available` is False (with `error`) if the model cannot load."""

    def __init__(self, settings: Settings, one_shot: bool = False) -> None:
        self.model_name = settings.reranker_model
        self.one_shot = one_shot
        self.backend = settings.reranker_backend
        self._settings = settings
        self._model: Any = None
        self.available: bool | None = None  # None: not tried yet
        self.error: str | None = None
        self.precision: str | None = None  # float32 | bfloat16, decided when the model loads
        self._retry_at: float | None = None  # when a retryable failure (hub unreachable) may be tried again
        self._missing = False  # the model was not on disk when it failed: tried again once it is
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
            if self.available is False and self._missing and embeddings.on_disk(self.model_name):
                # On disk since it failed (fetched, or its folder made, as the warning told the user): a
                # long-running server answered unreranked until restarted while a new process reranked.
                self.available, self.error, self._retry_at = None, None, None
            if self.available is not None:
                return self.available
            try:
                source = resolve_model(self.model_name, self._settings)
                self._model = load_model(source, self._settings, self._load)
                self.precision = ("float32" if isinstance(self._model, numpy_encoder.NumpyCrossEncoder)
                                  else resolve_precision(self._settings.rerank_precision, self._settings.device))
                self.available = True
            except Exception as exc:
                log.info("reranker %s unavailable: %s", self.model_name, exc)
                self.error = _describe(exc)
                self.available = False
                self._missing = not embeddings.on_disk(self.model_name)  # a broken folder is not retried each query
                if getattr(exc, "retryable", False):
                    self._retry_at = time.monotonic() + embeddings.HUB_RETRY_SECONDS
            return self.available

    def warm(self) -> None:
        """Load a reranker that is on disk, with its weights, so the query's first score does not wait for them
        (a CLI query does this while the store opens). An uncached hub model is left to `load`: its download or
        hub probe belongs to a query that reaches reranking."""
        if self.available is None and not embeddings.on_disk(self.model_name):
            return
        if self.load() and isinstance(self._model, numpy_encoder.NumpyCrossEncoder):
            self._model.w  # noqa: B018 - reads the safetensors file (~90 MB) now

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
        fast = self._numpy_model(target, local_only)
        if fast is not None:
            return fast
        from sentence_transformers import CrossEncoder

        return CrossEncoder(target, device=self._settings.device, max_length=self._settings.rerank_max_length,
                            local_files_only=local_only)

    def _numpy_model(self, target: str, local_only: bool) -> numpy_encoder.NumpyCrossEncoder | None:
        """The torch-free cross-encoder for a local model it reproduces, on CPU in float32; None otherwise.

        Not when bfloat16 is asked for explicitly, nor in a long-lived process (the server) whose precision
        `auto` would be bfloat16: there torch's import is paid once and bfloat16 scores 1.6-1.8x faster. A
        one-shot process (the CLI) always takes numpy: torch's import alone outweighs that. A hub name
        (local_only False) is downloaded by CrossEncoder once; later processes find it cached and take this path.
        """
        s = self._settings
        if (not NUMPY_RERANKER or not local_only or s.device != "cpu" or s.rerank_precision == "bfloat16"
                or (not self.one_shot and s.rerank_precision == "auto" and cpu_computes_bfloat16())
                or not numpy_encoder.supports_cross_encoder(target)):
            return None
        return numpy_encoder.NumpyCrossEncoder(target, max_length=s.rerank_max_length, batch_size=s.rerank_batch_size)

    def raw_scores(self, query: str, passages: list[str]) -> Any:
        """The model's logits: one per passage, or a row of logits per passage for multi-label models."""
        if isinstance(self._model, numpy_encoder.NumpyCrossEncoder):
            return self._model.predict_logits(query, passages)
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


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 (AVX512-BF16 or AMX), read from /proc/cpuinfo so that deciding
    does not import torch; False where that file does not exist (then `auto` means float32 for numpy)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


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


def get_reranker(settings: Settings, one_shot: bool = False) -> Reranker:
    """The process's reranker for these settings; `one_shot` (a CLI command) prefers the torch-free backend."""
    key = (settings.reranker_backend, settings.reranker_model, settings.device, settings.rerank_max_length,
           settings.rerank_precision, one_shot)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = Reranker(settings, one_shot)
        return _cache[key]
