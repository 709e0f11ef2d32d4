"""A torch-free encoder for BERT sentence-transformers models with mean pooling (the packaged all-MiniLM-L6-v2).

Why: a CLI query from a new process spent ~4-9 s importing torch and sentence-transformers and loading the
model to embed one query; this reads the same safetensors weights with numpy and the same tokenizer.json with
the `tokenizers` library (no transformers import) and embeds a query in ~0.1 s after a ~0.3 s load, with
vectors within 1e-6 cosine of sentence-transformers' (tests/test_numpy_encoder.py).

Measured against the other option, an ONNX Runtime session over an exported graph: onnxruntime imports in
~0.4 s and exporting needs torch plus the `onnx` package (not a dependency; torch 2.13's exporter fails
without it), i.e. a setup step and a new dependency, for no gain at query sizes. See benchmarks/README.md.

The forward pass is BERT's as transformers computes it in float32: embeddings (word + position + token type)
and LayerNorm, then per layer self-attention (padding masked), residual + LayerNorm, GELU (erf form) feed-forward,
residual + LayerNorm; then sentence-transformers' mean pooling over the attention mask and L2 normalisation.

`NumpyCrossEncoder` runs the same forward pass (`BertForward`) for BERT cross-encoders (BertForSequenceClassification
with one label, e.g. cross-encoder/ms-marco-MiniLM-L6-v2): the (query, passage) pair with token types 0/1, then
BERT's pooler (dense + tanh on [CLS]) and the classifier, i.e. the logit CrossEncoder.predict computes, within 1e-4
(tests/test_numpy_reranker.py). Why: reranking in a new CLI process imported torch for one query (+4-9 s).
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: What the folder must hold for this encoder to reproduce sentence-transformers exactly; anything else
#: (another architecture, pooling or module list) is left to sentence-transformers.
_MODULES = ["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize"]
#: Batches up to this many tokens (a query, a document context) run on one BLAS thread (see _hidden_limited).
ONE_THREAD_TOKENS = 512
#: Attention scores one batch may hold (float32: 64 MB): a batch of 32 pairs of 512 tokens would need
#: 32 x 12 heads x 512^2 x 4 bytes = 400 MB, so long inputs run in smaller batches (results are the same).
MAX_ATTENTION_SCORES = 16_000_000
#: Threads NumpyCrossEncoder.predict_logits scores pairs in (fewer when the process may use fewer CPUs): 2 is the
#: machine we measure on (benchmarks/cli_latency.py); a setting candidate.
RERANK_THREADS = 2
_POOLING_MEAN_ONLY = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
                      "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def supports(folder: str | Path) -> bool:
    """True when `folder` is a BERT + mean pooling + normalize sentence-transformers model with safetensors
    weights and a fast tokenizer, i.e. exactly what `NumpyBertEmbedder` computes."""
    f = Path(folder)
    try:
        modules = [m["type"] for m in _json(f / "modules.json")]
        cfg = _json(f / "config.json")
        pooling = _json(f / "1_Pooling" / "config.json")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return (modules == _MODULES and cfg.get("model_type") == "bert" and cfg.get("hidden_act") == "gelu"
            and cfg.get("position_embedding_type", "absolute") == "absolute"
            and all(pooling.get(k, False) == v for k, v in _POOLING_MEAN_ONLY.items())
            and (f / "model.safetensors").is_file() and (f / "tokenizer.json").is_file())


def _gelu(h: Any) -> Any:
    """BERT's exact GELU, 0.5 h (1 + erf(h / sqrt 2)), with erf by Abramowitz & Stegun 7.1.26 (absolute error
    < 1.5e-7): numpy has no erf and scipy.special costs ~1 s to import. Written for few passes over memory
    (in-place ops, 4 temporaries instead of ~15): erf was 23 % of a reranking profile; this form takes 10.1
    instead of 14.6 ms of CPU on a 550 x 1536 batch (same values within 5e-7).
    With p = (1 - erf(|x|)) / 2 (the polynomial times exp(-x^2), halved): GELU is h (1 - p) for h >= 0 and
    h p below, since erf is odd."""
    import numpy as np

    a = np.abs(h)
    a *= 1.0 / math.sqrt(2.0)
    t = a * 0.3275911
    t += 1.0
    np.reciprocal(t, out=t)
    p = t * 1.061405429
    for coef in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p += coef
        p *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    p *= a
    p *= 0.5
    p *= h  # h p: the value below 0; h (1 - p) = h - h p above
    return np.where(h >= 0, h - p, p)


def _layer_norm(x: Any, w: Any, b: Any, eps: float) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / (var + eps) ** 0.5 * w + b


def _batches(lengths: list[int], batch_size: int, heads: int) -> Any:
    """Index lists of at most `batch_size` inputs, longest first (as sentence-transformers batches: similar
    lengths pad little), cut further so a batch's attention scores stay within MAX_ATTENTION_SCORES."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    start = 0
    while start < len(order):
        longest = max(1, lengths[order[start]])
        rows = max(1, min(batch_size, MAX_ATTENTION_SCORES // (heads * longest * longest)))
        yield order[start:start + rows]
        start += rows


def _padded(rows: list[list[int]], dtype: Any) -> Any:
    """`rows` right-padded with 0 into one array (ids, token types, or 1.0 masks)."""
    import numpy as np

    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def rerank_threads() -> int:
    """Threads a reranking call uses: the CPUs this process may run on, at most RERANK_THREADS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(RERANK_THREADS, cpus))


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """OpenBLAS (numpy's BLAS) on one thread inside the block; unchanged without threadpoolctl. Process-wide:
    a concurrent call of another thread runs on one BLAS thread meanwhile (slower, same results)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


class BertForward:
    """BERT's encoder (embeddings and transformer layers) over the safetensors weights of `folder`, in numpy
    float32; the "bert." prefix of task models (BertForSequenceClassification) is dropped from weight names."""

    def __init__(self, folder: Path) -> None:
        import numpy as np

        self._np = np
        cfg = _json(folder / "config.json")
        self.heads, self.eps = int(cfg["num_attention_heads"]), float(cfg["layer_norm_eps"])
        self.layers = int(cfg["num_hidden_layers"])
        self.max_positions = int(cfg.get("max_position_embeddings", 512))
        self.dimension = int(cfg["hidden_size"])
        self._weights_file = folder / "model.safetensors"
        self._weights: dict[str, Any] | None = None
        self._weights_lock = threading.Lock()

    @property
    def w(self) -> dict[str, Any]:
        """The weights, read on first use: an ingest (`kb add-folder`) only counts tokens with this encoder and
        embeds with torch, so it no longer holds a second 90 MB copy of all-MiniLM-L6-v2 (and its ~80 MB load
        peak) that no query of that process reads."""
        if self._weights is None:
            with self._weights_lock:
                if self._weights is None:
                    from safetensors.numpy import load_file

                    self._weights = {k.removeprefix("bert."): v for k, v in load_file(str(self._weights_file)).items()}
        return self._weights

    def _hidden_limited(self, ids: Any, mask: Any, types: Any = None) -> Any:
        """`_hidden` on one BLAS thread for query-sized input: OpenBLAS's threads took 90-700 ms instead of
        10-20 ms for one query on a busy 2-core machine (waking and spinning for tiny products)."""
        if ids.size > ONE_THREAD_TOKENS:
            return self._hidden(ids, mask, types)
        with one_blas_thread():
            return self._hidden(ids, mask, types)

    def _hidden(self, ids: Any, mask: Any, types: Any = None, first_only: bool = False) -> Any:
        """The last layer's hidden states; `types` are the token type ids (None: all 0, a single text).
        `first_only`: the last layer computes position 0 only ([CLS], all a cross-encoder's head reads): its
        keys and values still come from every token, so that row is the same, for ~14 % fewer multiply-adds."""
        w = self.w
        type_rows = w["embeddings.token_type_embeddings.weight"]
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:ids.shape[1]]
             + (type_rows[0] if types is None else type_rows[types]))
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        # Padding gets the most negative float32 added before softmax, as transformers' extended mask does.
        bias = (1.0 - mask)[:, None, None, :] * self._np.finfo(self._np.float32).min
        for layer in range(self.layers):
            x = self._layer(x, bias, f"encoder.layer.{layer}.", first_only and layer == self.layers - 1)
        return x

    def _dense(self, x: Any, name: str) -> Any:
        # As one 2-D product: BLAS takes the transposed weight as is, while a stacked 3-D matmul over
        # non-contiguous views falls back to numpy's own loops (measured 10x slower than torch).
        weight = self.w[f"{name}.weight"]
        out = x.reshape(-1, x.shape[-1]) @ weight.T + self.w[f"{name}.bias"]
        return out.reshape(*x.shape[:-1], weight.shape[0])

    def _layer(self, x: Any, bias: Any, p: str, first_only: bool = False) -> Any:
        """One transformer layer; `first_only`: the output for position 0 only (queries from that row)."""
        np = self._np
        b, n, d = x.shape
        hd = d // self.heads

        def heads(t: Any) -> Any:
            return np.ascontiguousarray(t.reshape(b, -1, self.heads, hd).transpose(0, 2, 1, 3))

        rows = x[:, :1] if first_only else x
        q = heads(self._dense(rows, f"{p}attention.self.query"))
        k, v = (heads(self._dense(x, f"{p}attention.self.{m}")) for m in ("key", "value"))
        scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(hd) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (scores / scores.sum(-1, keepdims=True)) @ v
        ctx = ctx.transpose(0, 2, 1, 3).reshape(b, rows.shape[1], d)
        x = _layer_norm(self._dense(ctx, f"{p}attention.output.dense") + rows,
                        self.w[f"{p}attention.output.LayerNorm.weight"], self.w[f"{p}attention.output.LayerNorm.bias"],
                        self.eps)
        h = _gelu(self._dense(x, f"{p}intermediate.dense"))
        return _layer_norm(self._dense(h, f"{p}output.dense") + x, self.w[f"{p}output.LayerNorm.weight"],
                           self.w[f"{p}output.LayerNorm.bias"], self.eps)


class NumpyBertEmbedder(BertForward):
    """The Embedder protocol (plus count_tokens/max_tokens) over numpy; see the module docstring."""

    def __init__(self, name: str, folder: str, batch_size: int) -> None:
        from tokenizers import Tokenizer

        f = Path(folder)
        super().__init__(f)
        self.name, self.batch_size = name, max(1, int(batch_size))
        self.max_seq_length = int(_json(f / "sentence_bert_config.json")["max_seq_length"])
        # tokenizer.json carries its own truncation (128) and fixed padding: sentence-transformers truncates
        # at max_seq_length (256) and pads each batch to its longest text.
        self.tokenizer = Tokenizer.from_file(str(f / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_length)
        self._tokenizer_file = f / "tokenizer.json"
        self._counter: Any = None  # an untruncated copy for count_tokens, built on first use (~50 ms)
        self.max_tokens = self.max_seq_length - self.tokenizer.num_special_tokens_to_add(False)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text, special tokens excluded, nothing truncated (as embeddings._count_with)."""
        if not texts:
            return []
        if self._counter is None:
            from tokenizers import Tokenizer

            counter = Tokenizer.from_file(str(self._tokenizer_file))
            counter.no_padding()
            counter.no_truncation()
            self._counter = counter
        return [len(e.ids) for e in self._counter.encode_batch(list(texts), add_special_tokens=False)]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        np = self._np
        encodings = self.tokenizer.encode_batch(list(texts))
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for batch in _batches([len(e.ids) for e in encodings], self.batch_size, self.heads):
            out[batch] = self._encode([encodings[i].ids for i in batch])
        return out.tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    def _encode(self, id_lists: list[list[int]]) -> Any:
        """Normalised mean-pooled sentence vectors of one padded batch."""
        np = self._np
        ids, mask = _padded(id_lists, np.int64), _padded([[1.0] * len(r) for r in id_lists], np.float32)
        x = self._hidden_limited(ids, mask)
        summed = (x * mask[:, :, None]).sum(1)
        pooled = summed / np.clip(mask.sum(1, keepdims=True), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


#: The weights the cross-encoder head needs besides the encoder's (names without the "bert." prefix).
_HEAD_WEIGHTS = {"pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"}


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor table of a safetensors file (8-byte little-endian length, then JSON), without reading weights."""
    with path.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        if not 0 < size < 100_000_000:
            raise ValueError("not a safetensors file")
        return json.loads(fh.read(size))


def _is_one_label_bert(cfg: dict[str, Any]) -> bool:
    """A BertForSequenceClassification config with one label and the BERT variant BertForward computes."""
    labels = len(cfg["id2label"]) if cfg.get("id2label") else cfg.get("num_labels", 2)  # transformers' default: 2
    return (cfg.get("model_type") == "bert" and cfg.get("architectures") == ["BertForSequenceClassification"]
            and labels == 1 and cfg.get("hidden_act") == "gelu"
            and cfg.get("position_embedding_type", "absolute") == "absolute")


def supports_cross_encoder(folder: str | Path) -> bool:
    """True when `folder` is a cross-encoder `NumpyCrossEncoder` reproduces: a one-label BERT sequence classifier
    in float32 safetensors with a tokenizer.json, loaded by CrossEncoder as one Transformer module (no
    modules.json, as older hub models, or a modules.json listing only that module)."""
    f = Path(folder)
    try:
        cfg = _json(f / "config.json")
        modules = _json(f / "modules.json") if (f / "modules.json").is_file() else None
        header = _safetensors_header(f / "model.safetensors")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    tensors = {k.removeprefix("bert."): v for k, v in header.items() if k != "__metadata__"}
    one_module = modules is None or (len(modules) == 1 and str(modules[0].get("type", "")).endswith(".Transformer"))
    return (_is_one_label_bert(cfg) and one_module and (f / "tokenizer.json").is_file()
            and _HEAD_WEIGHTS <= tensors.keys()
            and all(isinstance(t, dict) and t.get("dtype") == "F32" for t in tensors.values()))


class NumpyCrossEncoder(BertForward):
    """The logit of a one-label BERT cross-encoder for (query, passage) pairs, as CrossEncoder.predict with an
    identity activation computes it: pairs tokenized by tokenizer.json (types 0/1, longest-first truncation to
    `max_length`, capped at the model's positions), the encoder, pooler (dense + tanh on [CLS]), classifier."""

    def __init__(self, folder: str | Path, max_length: int, batch_size: int) -> None:
        from tokenizers import Tokenizer

        f = Path(folder)
        super().__init__(f)
        self.batch_size = max(1, int(batch_size))
        self.max_length = min(int(max_length), self.max_positions)
        try:
            side = str(_json(f / "tokenizer_config.json").get("truncation_side", "right"))
        except (OSError, ValueError, AttributeError):
            side = "right"
        self.tokenizer = Tokenizer.from_file(str(f / "tokenizer.json"))
        self.tokenizer.no_padding()  # each batch pads to its longest pair, as CrossEncoder does (padding=True)
        self.tokenizer.enable_truncation(self.max_length, strategy="longest_first", direction=side)

    def predict_logits(self, query: str, passages: list[str]) -> list[float]:
        """One logit per passage, in the order given.

        The pairs, sorted by length (little padding), run in batches of about a quarter of them (at most
        `batch_size`, fewer when long) on `rerank_threads()` threads with one BLAS thread each: numpy's
        element-wise and attention work (~40 % of the CPU time: 123 of 316 ms for 20 pairs, the dense products
        the rest) then runs on both cores too, a thread on a busy core takes fewer batches, and OpenBLAS no
        longer splits each of the ~2,900 small attention products of a 20-pair call across threads that spin
        when a core is busy (2.5 s instead of 6.3 s for 20 pairs at load average 17; logits within 4e-8)."""
        if not passages:
            return []
        np = self._np
        encodings = self.tokenizer.encode_batch([(query, p) for p in passages])
        out = np.empty(len(passages), dtype=np.float32)
        threads = rerank_threads()
        size = max(1, min(self.batch_size, -(-len(passages) // (2 * threads))))

        def score(batch: list[int]) -> None:
            out[batch] = self._logits([encodings[i] for i in batch])

        batches = list(_batches([len(e.ids) for e in encodings], size, self.heads))
        with one_blas_thread():
            if threads == 1 or len(batches) == 1:
                for batch in batches:
                    score(batch)
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(threads, thread_name_prefix="rerank") as pool:
                    list(pool.map(score, batches))
        return [float(v) for v in out]

    def _logits(self, encodings: list[Any]) -> Any:
        np = self._np
        ids, types = _padded([e.ids for e in encodings], np.int64), _padded([e.type_ids for e in encodings], np.int64)
        mask = _padded([e.attention_mask for e in encodings], np.float32)
        cls = self._hidden(ids, mask, types, first_only=True)[:, 0]
        pooled = np.tanh(self._dense(cls, "pooler.dense"))
        return self._dense(pooled, "classifier")[:, 0]
