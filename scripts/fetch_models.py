"""Download the configured hub models into the Hugging Face cache ahead of time (needs network once).

Queries load a model on first use anyway; this is for machines that will lose the network (CI, air-gapped
hosts). A cached model then loads from the cache with no hub request — no HF_HUB_OFFLINE needed. Usage:
    .venv/bin/python scripts/fetch_models.py [MODEL ...]   # default: the configured embedding and reranker models
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Export formats the PyTorch loaders never read: the default reranker's repo holds several hundred MB of them.
SKIP = ["onnx/*", "openvino/*", "*.onnx", "tf_model.h5", "flax_model.msgpack", "rust_model.ot", "*.tflite", "coreml/*"]


def main() -> int:
    # Fetching is the point of this script: a shell-wide HF_HUB_OFFLINE=1 would refuse every download.
    os.environ.pop("HF_HUB_OFFLINE", None)
    from huggingface_hub import snapshot_download

    from research_agent.config import load_settings
    from research_agent.embeddings import _PACKAGED_NAMES

    settings = load_settings()
    names = sys.argv[1:] or [settings.embedding_model, settings.reranker_model]
    status = 0
    for name in names:
        if name.lower() in _PACKAGED_NAMES or Path(name).expanduser().exists():
            print(f"{name}: ships with an installed package or is a local folder; nothing to fetch")
            continue
        try:
            path = snapshot_download(name, ignore_patterns=SKIP)
            print(f"{name}: cached at {path}")
        except Exception as exc:  # a script for people: say what failed and go on
            print(f"{name}: FAILED ({type(exc).__name__}: {exc})", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
