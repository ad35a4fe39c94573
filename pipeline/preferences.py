"""Preference data: k >= 3 SFT-policy responses per reward-split prompt, ranked by the annotators.

Seed 000 §3.4: pairwise RM training with at least three responses per prompt. For each prompt of
the pool's `reward` split, the SFT policy samples `k` responses and the world's `AnnotatorPool`
ranks them at a labelling time that advances through the campaign (so the annotators' drift,
seed 001 §3.1, shows up in the data). External human rankings are read too when the real-data
folder is given: hh-rlhf chosen/rejected pairs and OpenAssistant ranked sibling replies. Every
ranking is stored with its annotator id and timestamp in the `preferences` table, one row per
ranked response; `expand_pairs` turns each ranking into all its (chosen, rejected) pairs.

    rlhf preferences --pool artifacts/store/pool --policy artifacts/models/sft \
        --realdata ../shared/realdata --out artifacts/store/preferences \
        --metrics artifacts/metrics/preferences.json

Without a pool (`--demos` instead of `--pool`), the prompts of the demonstrations are used.

Human labels only (`preferences.labels: human`, the realdata profile: no world, no simulated
annotators): the rankings are the human preference pairs ingest kept with their prompts
(`external_pairs`: hh-rlhf chosen/rejected, OpenAssistant ranks) plus any annotation-queue JSONL
files (`--queue`, the format in `read_queue`), each checked against the store's `prompts`; a
label that fails a check goes to the `rejected_labels` quarantine with reason codes, so
input = kept + rejected per source. `gold_fraction` of the labelled prompts go to split `gold`:
only the held-out gold RM (`rlhf judge`, pipeline/judges.py) trains on them.

    rlhf preferences --labels-from artifacts/store --queue data/queue.jsonl \
        --out artifacts/store/preferences --rejected-out artifacts/store/rejected_labels
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rlhf.pipeline.text import clean, split_dialogue
from rlhf.store.hashing import content_hash, hash_fraction, hashed_split

HH_FILE = "hh-rlhf__harmless-base_test.jsonl.gz"
OASST_FILE = "Open-Assistant__en_100_tree.jsonl"


@dataclass(frozen=True)
class AnnotatorConfig:
    """The simulated annotator pool (the world's `AnnotatorPool` arguments)."""

    n_annotators: int = 5
    noise_std: float = 0.4  # per-label noise on the 0-5 scale
    bias: dict[str, float] = field(default_factory=dict)  # annotator id -> constant offset
    drift_per_day: float = 0.02  # systematic drift of the labels per day (seed 001 §3.1)
    start: str = "2026-01-05"  # first labelling day (UTC)
    labels_per_day: int = 100  # rankings per day: how fast the campaign's clock advances


@dataclass(frozen=True)
class PreferencesConfig:
    """params.yaml `preferences`."""

    labels: str = "annotators"  # annotators: the world's pool ranks SFT samples; human: human
    # labels only (ingest's external_pairs + annotation queue files), no policy sampling
    gold_fraction: float = 0.0  # human labels: share of prompts whose labels train only the
    # held-out gold RM (split "gold", Gao et al. 2022); 0 = none
    k: int = 4  # policy responses per prompt (seed 000 §3.4: at least 3)
    demo_candidates: int = 0  # + this many demonstration responses of the prompt's topic
    max_prompts: int = 0  # 0 = every reward-split prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    batch_size: int = 64
    heldout_fraction: float = 0.15  # prompts whose rankings are kept for RM evaluation
    seed: int = 0
    annotators: AnnotatorConfig = field(default_factory=AnnotatorConfig)
    hh_heldout_fraction: float = 0.2  # the hh-rlhf file's own train/test split, by pair hash
    hh_max_pairs: int = 0  # 0 = all pairs of the file
    include_oasst: bool = True

    def __post_init__(self):
        if self.k < 3:
            raise ValueError("k must be >= 3 (seed 000 §3.4: at least 3 responses per prompt)")
        if not 0.0 <= self.heldout_fraction < 1.0 or not 0.0 <= self.hh_heldout_fraction < 1.0:
            raise ValueError("held-out fractions must be in [0, 1)")
        if self.labels not in ("annotators", "human"):
            raise ValueError("labels must be 'annotators' or 'human'")
        if not 0.0 <= self.gold_fraction < 1.0 or self.gold_fraction + self.heldout_fraction >= 1:
            raise ValueError("gold_fraction must be in [0, 1) and leave room for training "
                             "(gold_fraction + heldout_fraction < 1)")


def heldout_or_train(key: str, fraction: float) -> str:
    """'heldout' for a stable `fraction` of keys, else 'train'."""
    return hashed_split(key, (("heldout", fraction), ("train", 1.0 - fraction)))


def split_of(prompt_id: str, fraction: float) -> str:
    """'heldout' for a stable `fraction` of prompt ids, else 'train'."""
    return heldout_or_train("pref:" + prompt_id, fraction)


# ---------------------------------------------------------------------------------------------
# Prompts


def reward_prompts_from_pool(pool_dir: str | Path) -> list[tuple[str, str]]:
    """(prompt_id, text) of the pool's reward split, sorted by prompt id."""
    from rlhf.store.io import read_table

    table = read_table("pool", pool_dir)
    if table.num_rows == 0:
        raise ValueError(f"the pool in {pool_dir} is empty")
    rows = [r for r in table.select(["prompt_id", "text", "split"]).to_pylist()
            if r["split"] == "reward"]
    return sorted((r["prompt_id"], r["text"]) for r in rows)


# Without a pool, the demonstration prompts stand in for it, split by prompt hash like the
# pool's reward / ppo / eval splits (shares of the pool's defaults).
FALLBACK_SPLITS: tuple[tuple[str, float], ...] = (("reward", 0.5), ("ppo", 0.3), ("eval", 0.2))


def fallback_split(prompt_id: str) -> str:
    return hashed_split("split:" + prompt_id, FALLBACK_SPLITS)


def prompts_from_demonstrations(demos_path: str | Path, split: str | None = None
                                ) -> list[tuple[str, str]]:
    """(prompt_id, text) of the distinct demonstration prompts (the fallback without a pool),
    only those of `split` (reward / ppo / eval, by `fallback_split`) when given."""
    from rlhf.pipeline.sft import read_demonstrations

    texts = {clean(r["prompt"]) for r in read_demonstrations(demos_path)}
    rows = [(content_hash(t), t) for t in texts]
    return sorted(r for r in rows if split is None or fallback_split(r[0]) == split)


# ---------------------------------------------------------------------------------------------
# External human rankings (each yields (group key, prompt, [responses best first]))


def read_hh_pairs(path: str | Path) -> Iterable[tuple[str, str, list[str]]]:
    """hh-rlhf chosen/rejected dialogues as (line key, prompt, [chosen reply, rejected reply]).

    Lines that are not JSON, lack either side, or whose two sides do not share the history are
    skipped (counted by the caller as input - kept)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            try:
                row = json.loads(line)
                chosen, rejected = split_dialogue(row["chosen"]), split_dialogue(row["rejected"])
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue
            if not chosen or not rejected or chosen[0] != rejected[0]:
                continue
            if not chosen[1] or not rejected[1] or chosen[1] == rejected[1]:
                continue
            yield f"hh:{n}", chosen[0], [chosen[1], rejected[1]]


def read_oasst_groups(path: str | Path) -> Iterable[tuple[str, str, list[str]]]:
    """OpenAssistant ranked sibling replies: (parent id, conversation so far, replies by rank)."""
    def walk(node, history):
        text = node.get("text") or ""
        role = node.get("role")
        turn = text if not history else f"{history}\n\n{'Human' if role == 'prompter' else 'Assistant'}: {text}"
        replies = [r for r in node.get("replies") or [] if isinstance(r, dict)]
        if role == "prompter":
            ranked = []
            for r in replies:
                try:
                    ranked.append((int(r.get("rank")), r.get("text") or ""))
                except (TypeError, ValueError):
                    continue
            ranked = sorted(x for x in ranked if x[1].strip())
            if len(ranked) >= 2:
                yield f"oasst:{node.get('message_id')}", turn, [t for _, t in ranked]
        for r in replies:
            yield from walk(r, turn)

    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                tree = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(tree, dict) and isinstance(tree.get("prompt"), dict):
                yield from walk(tree["prompt"], "")


def external_rows(realdata: str | Path, cfg: PreferencesConfig) -> tuple[list[dict], dict]:
    """`preferences` rows of the external rankings found in `realdata` (none if absent)."""
    realdata = Path(realdata)
    rows: list[dict] = []
    counts: dict[str, int] = {}
    sources = [("hh-rlhf", realdata / HH_FILE, read_hh_pairs, cfg.hh_max_pairs)]
    if cfg.include_oasst:
        sources.append(("oasst", realdata / OASST_FILE, read_oasst_groups, 0))
    for source, path, reader, cap in sources:
        if not path.is_file():
            counts[source] = 0
            continue
        n = 0
        for key, prompt, ranked in reader(path):
            if cap and n >= cap:
                break
            pid = content_hash(prompt)
            split = heldout_or_train(key, cfg.hh_heldout_fraction)
            for rank, resp in enumerate(ranked):
                rows.append({
                    "ranking_id": content_hash(key)[:16], "prompt_id": pid, "prompt": prompt,
                    "response_hash": content_hash(resp), "response": resp,
                    "annotator_id": source, "labeled_at": None, "score": None, "rank": rank,
                    "source": source, "response_source": "human", "split": split,
                    "gold_score": None,
                })
            n += 1
        counts[source] = n
    return rows, counts


# ---------------------------------------------------------------------------------------------
# Rankings -> pairs


def expand_pairs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """All (chosen, rejected) pairs of each ranking: k responses give k(k-1)/2 pairs.

    Identical responses (same hash) and equal annotator scores make no pair. Each pair carries
    its prompt_id, source, split, annotator_id and the gold scores of both sides when known.
    """
    by_ranking: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_ranking[r["ranking_id"]].append(r)
    pairs = []
    for rid in sorted(by_ranking):
        ranked = sorted(by_ranking[rid], key=lambda r: r["rank"])
        for i, a in enumerate(ranked):
            for b in ranked[i + 1:]:
                if a["response_hash"] == b["response_hash"]:
                    continue
                if a["score"] is not None and b["score"] is not None and a["score"] == b["score"]:
                    continue
                pairs.append({
                    "prompt": a["prompt"], "chosen": a["response"], "rejected": b["response"],
                    "prompt_id": a["prompt_id"], "source": a["source"], "split": a["split"],
                    "annotator_id": a["annotator_id"],
                    "gold_chosen": a.get("gold_score"), "gold_rejected": b.get("gold_score"),
                })
    return pairs


# ---------------------------------------------------------------------------------------------
# The stage


def default_world() -> tuple[Callable, Callable[[str, str], float]]:
    from rlhf.pipeline.world.annotators import AnnotatorPool
    from rlhf.pipeline.world.judge import gold_score

    return AnnotatorPool, gold_score


def topic_of(prompt: str) -> str | None:
    """The world's topic of a prompt (None when it has none or the world is not installed)."""
    try:
        from rlhf.pipeline.world.judge import infer_topic
    except ImportError:
        return None
    topic = infer_topic(prompt)
    return topic.name if topic is not None else None


def demo_candidates(prompts: Sequence[str], demos_path: str | Path, n: int,
                    seed: int) -> list[list[str]]:
    """`n` demonstration responses per prompt, drawn from the demonstrations of its topic.

    A weak SFT policy's samples barely differ in quality, so rankings of them alone teach the RM
    little; demonstrations of the same topic (of every quality: good, filler, wrong-topic, ...)
    put the whole quality range into each ranking. Deterministic per (seed, prompt)."""
    import random

    from rlhf.pipeline.sft import read_demonstrations

    by_topic: dict[str, list[str]] = defaultdict(list)
    every: list[str] = []
    for r in read_demonstrations(demos_path):
        by_topic[str(r.get("topic"))].append(clean(r["response"]))
        every.append(clean(r["response"]))
    out = []
    for p in prompts:
        bank = by_topic.get(str(topic_of(p))) or every
        rng = random.Random(f"{seed}|{content_hash(p)}")
        out.append(rng.sample(bank, min(n, len(bank))))
    return out


def annotate(prompts: Sequence[tuple[str, str]], responses: Sequence[Sequence[str]],
             cfg: PreferencesConfig, pool_cls, judge,
             origins: Sequence[Sequence[str]] | None = None) -> list[dict]:
    """Rank each prompt's responses with one annotator of the pool, the clock advancing."""
    a = cfg.annotators
    start = datetime.fromisoformat(a.start).replace(tzinfo=UTC)
    pool = pool_cls(n_annotators=a.n_annotators, noise_std=a.noise_std, bias=dict(a.bias),
                    drift_per_day=a.drift_per_day, seed=cfg.seed, start=start)
    rows = []
    for i, ((pid, prompt), resps) in enumerate(zip(prompts, responses)):
        when = start + timedelta(days=i / a.labels_per_day)
        label = pool.label(prompt, list(resps), when)
        rank_of = {idx: pos for pos, idx in enumerate(label.ranking)}
        labeled_at = label.labeled_at
        if labeled_at.tzinfo is None:
            labeled_at = labeled_at.replace(tzinfo=UTC)
        rid = content_hash(f"{pid}|{label.annotator_id}|{labeled_at.isoformat()}")[:16]
        split = split_of(pid, cfg.heldout_fraction)
        for j, resp in enumerate(resps):
            rows.append({
                "ranking_id": rid, "prompt_id": pid, "prompt": prompt,
                "response_hash": content_hash(resp), "response": resp,
                "annotator_id": label.annotator_id, "labeled_at": labeled_at,
                "score": float(label.scores[j]), "rank": rank_of[j], "source": "annotator",
                "response_source": origins[i][j] if origins else "policy",
                "split": split, "gold_score": float(judge(prompt, resp)),
            })
    return rows


def run(cfg: PreferencesConfig, policy_dir: str | Path, out_dir: str | Path,
        pool_dir: str | Path | None = None, demos_path: str | Path | None = None,
        realdata: str | Path | None = None, world: tuple[Callable, Callable] | None = None, progress=None) -> dict[str, Any]:
    """The `preferences` stage: sample, annotate, read external rankings, write the table."""
    from rlhf.pipeline.policy import load_policy, quiet_hf, sample
    from rlhf.store.io import staged_folders, write_shard

    quiet_hf()
    if pool_dir is not None and Path(pool_dir).is_dir():
        prompts, prompt_source = reward_prompts_from_pool(pool_dir), "pool:reward"
    elif demos_path is not None:
        prompts = prompts_from_demonstrations(demos_path, "reward")
        prompt_source = "demonstrations:reward"
    else:
        raise ValueError("give --pool (a pool table folder) or --demos")
    if cfg.max_prompts:
        prompts = sorted(prompts, key=lambda x: hash_fraction("cap:" + x[0]))[: cfg.max_prompts]
        prompts.sort()
    if not prompts:
        raise ValueError("no prompts to sample responses for")
    pool_cls, judge = world or default_world()
    model, tok = load_policy(policy_dir)
    samples = sample(model, tok, [t for _, t in prompts], n=cfg.k, max_new_tokens=cfg.max_new_tokens,
                     temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                     batch_size=cfg.batch_size, progress=progress)
    responses = [[s.response for s in ss] for ss in samples]
    origins = [["policy"] * len(r) for r in responses]
    if cfg.demo_candidates:
        if demos_path is None:
            raise ValueError("preferences.demo_candidates needs --demos")
        extra = demo_candidates([t for _, t in prompts], demos_path, cfg.demo_candidates, cfg.seed)
        responses = [r + e for r, e in zip(responses, extra)]
        origins = [o + ["demonstration"] * len(e) for o, e in zip(origins, extra)]
    rows = annotate(prompts, responses, cfg, pool_cls, judge, origins)
    ext_rows, ext_counts = ([], {}) if realdata is None else external_rows(realdata, cfg)
    out_dir = Path(out_dir)
    with staged_folders([out_dir]) as staged:  # both shards appear together, or neither
        write_shard("preferences", rows, staged[out_dir] / "part-00000.parquet")
        write_shard("preferences", ext_rows, staged[out_dir] / "part-00001.parquet")
    pairs = expand_pairs(rows)
    n_distinct = sum(len(set(r)) for r in responses)
    metrics = {
        "prompt_source": prompt_source,
        "n_prompts": len(prompts),
        "k": cfg.k,
        "demo_candidates": cfg.demo_candidates,
        "mean_gold_policy": _mean([r["gold_score"] for r in rows
                                   if r["response_source"] == "policy"]),
        "mean_gold_demonstration": _mean([r["gold_score"] for r in rows
                                          if r["response_source"] == "demonstration"]),
        "n_responses": len(rows),
        "distinct_response_share": n_distinct / max(1, len(rows)),
        "n_rankings": len({r["ranking_id"] for r in rows}),
        "n_pairs": len(pairs),
        "n_pairs_heldout": sum(p["split"] == "heldout" for p in pairs),
        "n_annotators": len({r["annotator_id"] for r in rows}),
        "annotator_gold_agreement": _agreement(pairs),
        "mean_gold_score": sum(r["gold_score"] for r in rows) / max(1, len(rows)),
        "external": ext_counts,
        "n_external_pairs": len(expand_pairs(ext_rows)),
    }
    return metrics


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _agreement(pairs: Sequence[dict]) -> float | None:
    """Share of annotator pairs whose order the gold judge agrees with (gold ties excluded)."""
    known = [p for p in pairs if p["gold_chosen"] is not None and p["gold_rejected"] is not None
             and p["gold_chosen"] != p["gold_rejected"]]
    if not known:
        return None
    return sum(p["gold_chosen"] > p["gold_rejected"] for p in known) / len(known)


# ---------------------------------------------------------------------------------------------
# Human labels only (labels: human)

QUEUE_PROVENANCE = ("annotator_id", "labeled_at")  # who labelled, when (seed 001 §3.1: drift)


def label_split(prompt_id: str, cfg: PreferencesConfig, pool_split: dict[str, str]) -> str:
    """gold (only the held-out gold RM trains on it) / heldout / train, by prompt hash; labels of
    an eval-split prompt are never trained on (they calibrate and test the RMs)."""
    x = hash_fraction("gold:" + prompt_id)
    if x < cfg.gold_fraction:
        return "gold"
    if pool_split.get(prompt_id) == "eval" or x < cfg.gold_fraction + cfg.heldout_fraction:
        return "heldout"
    return "train"


def _pool_splits(root: Path) -> dict[str, str]:
    """prompt_id -> its dedup cluster's split (pool representatives and their `similar` rows)."""
    from rlhf.store.io import read_table

    if not (root / "pool").is_dir():
        return {}
    out = {r["prompt_id"]: r["split"]
           for r in read_table("pool", root / "pool").select(["prompt_id", "split"]).to_pylist()}
    if (root / "similar").is_dir():
        for r in read_table("similar", root / "similar").select(
                ["prompt_id", "representative_id"]).to_pylist():
            out.setdefault(r["prompt_id"], out.get(r["representative_id"], ""))
    return out


def read_queue(path: str | Path, name: str) -> Iterable[tuple[int, str, dict | None, list[str]]]:
    """An annotation-queue JSONL file (what a labelling tool exports), one label per line:

        {"prompt": "<the prompt as ingested>" | "prompt_id": "<its content hash>",
         "chosen": "...", "rejected": "..."  |  "responses": ["best", "next", ...],
         "annotator_id": "alice", "labeled_at": "2026-01-05T10:00:00Z"}

    Yields (line number, raw line, parsed label or None, reason codes): the label as
    {"prompt_id", "prompt" (text or None), "ranked", "annotator_id", "labeled_at"}."""
    from rlhf.pipeline.ingest import _missing, _parse_timestamp

    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            raw = line.rstrip("\n")[:2000]
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                yield n, raw, None, ["bad_json"]
                continue
            if not isinstance(obj, dict):
                yield n, raw, None, ["bad_json"]
                continue
            reasons: list[str] = []
            ranked = obj.get("responses") if "responses" in obj else [obj.get("chosen"),
                                                                      obj.get("rejected")]
            prompt, pid = obj.get("prompt"), obj.get("prompt_id")
            if _missing(prompt) and _missing(pid):
                reasons.append("missing_provenance")
            elif not isinstance(prompt if not _missing(prompt) else pid, str):
                reasons.append("bad_type")
            if not isinstance(ranked, list) or len(ranked) < 2 \
                    or not all(isinstance(r, str) for r in ranked):
                reasons.append("bad_type")
            for key in QUEUE_PROVENANCE:
                if _missing(obj.get(key)):
                    reasons.append("missing_provenance")
                elif not isinstance(obj[key], str):
                    reasons.append("bad_type")
            labeled_at = None
            if not reasons:
                try:
                    labeled_at = _parse_timestamp(obj["labeled_at"])
                except ValueError:
                    reasons.append("bad_type")
            if reasons:
                yield n, raw, None, sorted(set(reasons))
                continue
            text = prompt.strip() if isinstance(prompt, str) and prompt.strip() else None
            yield n, raw, {"prompt_id": content_hash(text) if text else pid, "prompt": text,
                           "ranked": ranked, "annotator_id": obj["annotator_id"],
                           "labeled_at": labeled_at}, []


def human_rows(store_root: str | Path, queue_paths: Sequence[str | Path],
               cfg: PreferencesConfig) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(preferences rows, rejected_labels rows, counts) from the store's `external_pairs` (the
    human pairs ingest kept with their prompts) and the annotation-queue files."""
    from collections import Counter

    from rlhf.store.io import read_table

    root = Path(store_root)
    if not (root / "prompts").is_dir():
        raise ValueError(f"no prompts table in {root} (run ingest first)")
    prompts = {r["prompt_id"]: r["text"]
               for r in read_table("prompts", root / "prompts").select(["prompt_id", "text"])
               .to_pylist()}
    pool_split = _pool_splits(root)
    rows: list[dict] = []
    rejected: list[dict] = []
    counts: dict[str, Counter] = defaultdict(Counter)
    reasons_seen: Counter = Counter()

    def add(source, source_file, line, pid, prompt, ranked, annotator, labeled_at, raw, reasons):
        counts[source]["input"] += 1
        reasons = list(reasons)
        if not reasons:
            if pid not in prompts:
                reasons.append("unknown_prompt")
            texts = [r.strip() for r in ranked]
            if any(not t for t in texts):
                reasons.append("empty")
            if len(set(texts)) < len(texts):
                reasons.append("equal_responses")
        if reasons:
            counts[source]["rejected"] += 1
            reasons_seen.update(reasons)
            rejected.append({"source_file": source_file, "source_line": line, "source_type": source,
                             "reasons": reasons, "prompt_id": pid, "raw": raw})
            return
        counts[source]["kept"] += 1
        prompt = prompt or prompts[pid]
        rid = content_hash(f"{source}|{source_file}|{line}|" + "|".join(ranked))[:16]
        split = label_split(pid, cfg, pool_split)
        for rank, resp in enumerate(ranked):
            resp = resp.strip()
            rows.append({"ranking_id": rid, "prompt_id": pid, "prompt": prompt,
                         "response_hash": content_hash(resp), "response": resp,
                         "annotator_id": annotator, "labeled_at": labeled_at, "score": None,
                         "rank": rank, "source": source, "response_source": "human",
                         "split": split, "gold_score": None})

    if (root / "external_pairs").is_dir():
        for p in read_table("external_pairs", root / "external_pairs").to_pylist():
            # a one-turn context is the prompt itself; a longer one is the dialogue so far
            prompt = None if p["n_turns"] == 1 else clean(p["context"])
            raw = json.dumps({"chosen": p["chosen"], "rejected": p["rejected"]},
                             ensure_ascii=True)[:2000]
            add(p["source"], p["source_file"], p["source_line"], p["prompt_id"], prompt,
                [p["chosen"], p["rejected"]], p["source"], None, raw, [])
    for qp in queue_paths:
        qp = Path(qp)
        for n, raw, label, reasons in read_queue(qp, qp.name):
            if label is None:
                add("queue", qp.name, n, None, None, [], "", None, raw, reasons)
                continue
            add("queue", qp.name, n, label["prompt_id"], None, label["ranked"],
                label["annotator_id"], label["labeled_at"], raw, [])
    by_source = {k: {"input": c["input"], "kept": c["kept"], "rejected": c["rejected"]}
                 for k, c in sorted(counts.items())}
    return rows, rejected, {"by_source": by_source, "by_reason": dict(sorted(reasons_seen.items()))}


def run_human(cfg: PreferencesConfig, store_root: str | Path, out_dir: str | Path,
              rejected_dir: str | Path, queue_paths: Sequence[str | Path] = (),
              metrics_path: str | Path | None = None) -> dict[str, Any]:
    """The `preferences` stage on human labels only: write `preferences` and `rejected_labels`."""
    from rlhf.store.io import staged_folders, write_shard, write_text_atomic

    rows, rejected, counts = human_rows(store_root, queue_paths, cfg)
    if not rows:
        raise ValueError(f"no usable human preference labels in {store_root} "
                         f"(or the queue files): {counts['by_source']}")
    out_dir, rejected_dir = Path(out_dir), Path(rejected_dir)
    with staged_folders([out_dir, rejected_dir]) as staged:
        write_shard("preferences", rows, staged[out_dir] / "part-00000.parquet")
        write_shard("rejected_labels", rejected, staged[rejected_dir] / "part-00000.parquet")
    pairs = expand_pairs(rows)
    metrics = {
        "labels": "human", "prompt_source": "human labels",
        "n_prompts": len({r["prompt_id"] for r in rows}),
        "n_rankings": len({r["ranking_id"] for r in rows}), "n_pairs": len(pairs),
        **{f"n_pairs_{s}": sum(p["split"] == s for p in pairs) for s in ("train", "heldout", "gold")},
        "n_annotators": len({r["annotator_id"] for r in rows}),
        "labels_by_source": counts["by_source"], "rejected_by_reason": counts["by_reason"],
        "invariant_holds": all(c["input"] == c["kept"] + c["rejected"]
                               for c in counts["by_source"].values()),
    }
    if metrics_path:
        write_text_atomic(metrics_path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics
