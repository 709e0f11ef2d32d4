"""Discovery's calibrated score: P(this node is one the task needs) from the node's retrieval evidence.

Why a fitted model: the hand-set score (z = 9 (cosine - 0.42) + 1.5 coverage + title coverage) was tuned
on a 30-node curated knowledge base. On a 10,000-tool catalog it was over-confident (mean score 0.76
while 30 % of answers were right, expected calibration error 0.47) and its fixed cut cost six real tasks
every answer (issue 14). The evidence per candidate node is cheap and mostly scale-free:

- `dense`: the best cosine between the task and the node's chunks (MiniLM);
- `dense_sq`: `dense` squared: the evidence of a cosine grows faster than linearly (MiniLM: 0.7 is far more
  telling over 0.5 than 0.5 is over 0.3); with it ToolGym dev tasks keeping a recommendation >= 0.5 went
  0.50 -> 0.54 in the fit, the no-match ones staying at none (issue 14, third round);
- `dense_margin`: `dense` minus the best cosine among the *other* candidates (the gap to the next
  candidates: positive only for the clear leader, negative for the runners-up). Copies of one tool (leaf
  sections with the same title: a catalog lists one tool under a dozen servers) are not rivals, so the gap
  is to the best candidate with another title (ToolGym dev, fit: real tasks with a leader >= 0.5 0.46 -> 0.50),
  nor is a tool that runs the task's conversion the wrong way (`against` > 0: reverse geocoding, cosine 0.69,
  made geocoding, 0.62, look like a runner-up; since A5's attack `against` is only ever > 0 on evidence from
  both sides of the conversion, so a tool matching one side stays a rival);
- `coverage` / `title_coverage`: the IDF-weighted share of the task's content words in the node's text
  / in its title and header path (shares of the task, so they do not grow with the knowledge base);
- `kw_rr`: 1 / the node's rank in the keyword (BM25) candidates, 0 when BM25 did not nominate it;
- `kw_rel`: the node's best BM25 score over the best BM25 score of the task (0..1; raw BM25 grows with
  the corpus, the ratio does not);
- `parent`: 1 when the node has sub-sections (a file root or a chapter: its own text is an intro);
- `key_word`: 1 when the node holds the task's rarest content word (highest IDF over the searched
  collections): "send a message to a Telegram group" is about Telegram, and a WhatsApp tool that
  matches every other word scored 0.59 without this feature, 0.49 with it (ToolGym dev, a no-match task:
  a near miss, see benchmarks/README.md);
- `thin_task`: the share of MIN_TASK_TERMS (3) content words the task lacks (0 for 3+, 2/3 for "fix it"):
  one or two generic words are thin evidence, yet their cosine to a short section is high ("fix it" gave a
  hotfix protocol 0.77 before this feature; docs/discovery.md's "padded with unknown words");
- `breadth`: the node's distinct content words d as d / (d + BREADTH_HALF), BM25-style saturation (a tool
  section ~20 words: 0.06, a curated section ~100: 0.25, a 1,500-word salad of common words: 0.8). Why:
  coverage rewards *containing* the task's words, and a node that contains every word says little about
  any (a word-salad file reached 0.5 on 7 of 10 no-match tasks without it, issue 14).

- `direction` / `against` (issue 14, fourth round; direction.py): how a conversion task's sides ("have an
  address, need latitude and longitude") line up with a tool section's sides (its parameters and the X of "X
  into Y" are what it takes, the Y or the rest of its description what it gives), -1..1 split into its positive
  part and its negative part. Why two: a tool that takes what the task wants is almost never right (ToolGym
  dev: 1 of 171 candidates), while agreeing is weak evidence; one coefficient fitted 1.4 for both and left
  reverse geocoding first for "address -> latitude"; split, `against` is a fixed prior (AGAINST_COEF: no
  two-sided wrong-way candidate of ToolGym dev is right, so a fit is bounded by its penalty alone). 0 on any
  node without a `Parameters:` line (curated knowledge), on tasks with no have/need or convert-into phrasing, on lookups
  ("from Hacker News get ...") and on a tool matching one side only (issue 14 A5: with one side enough,
  no-match tasks reached 0.85);
- `tool`: 1 for a tool section (a node with a `Parameters:` line), in TOOL_FEATURES: fitted after the others
  on the tool rows alone. Why: on the catalog the leaders were under-confident (ToolGym dev, top answer: mean
  0.48, right 58 %) while the golden set's were not (0.48 / 49 %); fitted jointly (+0.9) it pulled the curated
  intercept down (the golden "logging" section 0.45 -> 0.26, under the prefer-the-parent line); fitted after,
  it is the catalog's residual offset (+0.2) and curated scores are untouched;
- `copies`: the other candidates with the same tool title (scoring.copies, n / (n + COPIES_HALF)), counted
  only when the node holds the task's rarest word. Why: a tool a dozen servers list (get_current_weather,
  mysql_query) is a real, common tool, and its copies split the probability between them; unrestricted, the
  copies of WhatsApp's send_message took "send a message to a Telegram group" (no tool serves it) to 0.61.

- `identifier` (a fixed prior, not fitted): 1 / sqrt(df) of the rarest code-like word of the task
  (`RESERVED_PREFIX`, `discoverContext`; analysis.identifiers) that the node holds verbatim, df being the
  number of nodes holding it (one holder: 1, three: 0.58, a hundred: 0.1). Why fixed: no ToolGym or golden
  task names an identifier, so the fit cannot see it, and the refit that made the catalog work weighed BM25
  (the only evidence that kept the whole token) down: "debug RESERVED_PREFIX validation" fell from 0.88 to
  0.67 on our own docs and code, and an identifier in one file of 1,100 left the top 10 (issue 14, third
  round). IDENTIFIER_COEF logits for a single holder make it the leader on that evidence alone.
  ranking.py limits it (fourth round): when a node defines the identifier, df counts definitions and a mere
  mention gets half its holders' weight (a TODO comment outranked the definition), and it is scaled by the
  share of the task's other words the base knows (a wedding-planning task naming RESERVED_PREFIX: 0.75).

A logistic model over them gives the probability; boosts (boosts.py) then multiply its odds, as before.
The coefficients below were fitted by benchmarks/fit_discovery.py on the *dev* tasks of the ToolGym
catalog (benchmarks/toolgym_tasks.jsonl) plus the curated golden set (tests/fixtures/knowledge), each set
weighted equally, so that one model fits both a large uneven catalog and a small curated knowledge base
(with its no-knowledge cases). Refit with that script after changing a feature; it prints this block.
"""

from __future__ import annotations

import math

FEATURES = ("dense", "dense_sq", "dense_margin", "coverage", "title_coverage", "kw_rr", "kw_rel", "parent", "key_word",
            "thin_task", "breadth", "direction", "copies", "tool")
#: A task with fewer content words than this counts as padded with unknown words (thin_task).
MIN_TASK_TERMS = 3
#: The distinct-word count at which breadth is 0.5 (a long curated section; tool sections have 10-40).
BREADTH_HALF = 300

#: Features only a catalog's tool sections have: fitted after the others, on those rows alone, so that curated
#: knowledge (where they are 0) is scored as the shared fit says (benchmarks/fit_discovery.py, fit).
TOOL_FEATURES = ("tool",)
#: The number of other copies at which `copies` is 0.5 (ToolGym: a weather or MySQL tool listed by 5-30 servers).
COPIES_HALF = 3

#: Log-odds added per unit of the `identifier` feature (a prior, see the module docstring): a node that is the
#: only holder of an identifier the task names gets odds x20 (0.2 -> 0.83); one of a hundred holders x1.35.
IDENTIFIER_COEF = 3.0
#: Log-odds added per unit of `against` (a prior, not fitted): a tool that runs the task's conversion the wrong way
#: on both sides (direction.py) gets odds /20 (reverse geocoding for "have an address, need latitude": 0.65 ->
#: 0.31). Why fixed: on ToolGym dev none of the 15 such candidates (8 tasks) is right, so the fit is bounded by
#: its L2 penalty alone (-1.6 fitted, which left reverse geocoding first); -3.0 is the identifier prior's size.
AGAINST_COEF = -3.0

# -- fitted by benchmarks/fit_discovery.py (see the module docstring) ---------------------------------------
INTERCEPT = -4.399
COEF = {
    "dense": 4.777,
    "dense_sq": 1.830,
    "dense_margin": 4.760,
    "coverage": 0.363,
    "title_coverage": -0.927,
    "kw_rr": 0.971,
    "kw_rel": 0.776,
    "parent": -0.725,
    "key_word": 0.277,
    "thin_task": -2.033,
    "breadth": -0.482,
    "direction": 0.739,
    "copies": 2.071,
    "tool": 0.194,
}
# -- end of fitted block ---------------------------------------------------------------------------------------

#: Logits are clipped so that exp() cannot overflow on an extreme feature row.
_Z_LIMIT = 50.0


def logit(row: dict[str, float]) -> float:
    """The model's log-odds for one candidate's feature row (missing features count as 0)."""
    z = INTERCEPT + sum(COEF[name] * float(row.get(name, 0.0)) for name in FEATURES) + prior(row)
    return max(-_Z_LIMIT, min(_Z_LIMIT, z))


def prior(row: dict[str, float]) -> float:
    """The log-odds of the evidence the fit cannot see (`identifier`, `against`); the fit takes it as an offset."""
    return IDENTIFIER_COEF * float(row.get("identifier", 0.0)) + AGAINST_COEF * float(row.get("against", 0.0))


def identifier_weight(df: int) -> float:
    """How surely an identifier held by `df` nodes names the node: 1 / sqrt(df), 0 when no node holds it."""
    return 1.0 / math.sqrt(df) if df > 0 else 0.0


def sigmoid(z: float) -> float:
    z = max(-_Z_LIMIT, min(_Z_LIMIT, z))
    return 1.0 / (1.0 + math.exp(-z))


def thin_task(n_terms: int) -> float:
    """The share of MIN_TASK_TERMS content words the task lacks: 0 for three or more, 1 for none."""
    return max(0, MIN_TASK_TERMS - n_terms) / MIN_TASK_TERMS


def copies(n_others: int) -> float:
    """How many other candidates are copies of this one (same tool title), saturated: n / (n + COPIES_HALF), 0..1."""
    return n_others / (n_others + COPIES_HALF)


def breadth(n_terms: int) -> float:
    """A node's distinct content words, saturated: n / (n + BREADTH_HALF), 0..1."""
    return n_terms / (n_terms + BREADTH_HALF)


def margins(dense: list[float], groups: list[str] | None = None, rivals: list[bool] | None = None) -> list[float]:
    """Each value minus the best of the others outside its group (the leader's gap to the runner-up is positive).

    `groups` (one key per value, default: each its own) names copies of one thing: a catalog lists the same
    tool under several servers (ToolGym: a dozen "sequentialthinking" and weather servers), and a copy is not
    a rival, so the gap is measured to the best candidate that is something else. `rivals` (default: all)
    says which values may be that something else: a tool that runs the task's conversion the wrong way
    (direction.py: it takes as input what the task wants) is no alternative, however close its words
    ("have an address, need latitude and longitude": reverse geocoding, cosine 0.69 against 0.62).
    """
    if not dense:
        return []
    keys = groups if groups is not None else [str(i) for i in range(len(dense))]
    ok = rivals if rivals is not None else [True] * len(dense)
    best: dict[str, float] = {}
    for k, d, rival in zip(keys, dense, ok):
        if rival:
            best[k] = max(best.get(k, d), d)
    top = sorted(best.items(), key=lambda kv: -kv[1])[:2]
    return [d - next((v for k, v in top if k != key), 0.0) for d, key in zip(dense, keys)]
