"""Training and dev judgments for SciFact and CoSQA, which ../shared/data ships only as test splits.

Usage: .venv/bin/python benchmarks/dev_sets.py SCIFACT_ZIP COCLR_DEV_JSON   # rewrites benchmarks/data/

Why: calibration and fusion must be fitted on judgments we do not report on. ../shared/data has NFCorpus
train/dev but only the test split of SciFact and CoSQA. Both public releases carry more:
- SciFact train: the SciFact release's `claims_train` (809 claims; a claim's `cited_doc_ids` are its
  relevant abstracts). This is how BEIR builds its qrels: the same rule applied to `claims_validation`
  reproduces ../shared/data/scifact/qrels/test.tsv exactly (339 of 339 rows). Source: the release as
  committed in github.com/sumithra-p-v/claimverifier (`data/scifact.zip`, `claims_train.csv`).
  Licence CC BY-NC 2.0: evaluation only.
- CoSQA dev: CoCLR's retrieval dev split (github.com/Jun-jie-Huang/CoCLR,
  `data/search/cosqa-retrieval-dev-500.json`): 500 queries over the same 6,267 functions as the test split
  (`retrieval_idx` n is corpus id `c<n>`), none of them a test query. Licence C-UDA (data).

Output (BEIR format, next to the shared sets' queries and corpus, which stay in ../shared/data):
benchmarks/data/scifact/qrels/train.tsv, benchmarks/data/cosqa/queries-dev.jsonl, benchmarks/data/cosqa/qrels/dev.tsv.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data"


def scifact_train(zip_path: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(zip_path) as zf:
        name = next(n for n in zf.namelist() if n.endswith("claims_train.csv"))
        rows = csv.DictReader(io.StringIO(zf.read(name).decode("utf-8")))
        pairs = [(r["id"], doc) for r in rows for doc in re.findall(r"\d+", r["cited_doc_ids"])]
    return list(dict.fromkeys(pairs))


def cosqa_dev(dev_json: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    records = json.loads(dev_json.read_text(encoding="utf-8"))
    queries = [{"_id": r["idx"], "text": r["doc"]} for r in records]
    return queries, [(r["idx"], f"c{int(r['retrieval_idx'])}") for r in records]


def write_qrels(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t1" for q, d in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    write_qrels(OUT / "scifact" / "qrels" / "train.tsv", scifact_train(Path(argv[0])))
    queries, pairs = cosqa_dev(Path(argv[1]))
    (OUT / "cosqa").mkdir(parents=True, exist_ok=True)
    (OUT / "cosqa" / "queries-dev.jsonl").write_text(
        "".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    write_qrels(OUT / "cosqa" / "qrels" / "dev.tsv", pairs)
    print(f"SciFact train: {len(scifact_train(Path(argv[0])))} judgments; CoSQA dev: {len(pairs)} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
