"""Download the configured hub models into the Hugging Face cache ahead of time (needs network once).

After this, queries load them with HF_HUB_OFFLINE=1 (CI, air-gapped machines). Usage:
    .venv/bin/python scripts/fetch_models.py [MODEL ...]   # default: the configured embedding and reranker models
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
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
            path = snapshot_download(name)
            print(f"{name}: cached at {path}")
        except Exception as exc:  # a script for people: say what failed and go on
            print(f"{name}: FAILED ({type(exc).__name__}: {exc})", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
