"""The `world` stage: the embedded default task, generated deterministically from a seed.

A self-contained RLHF world so that `dvc repro` trains for real on a CPU with nothing downloaded:
raw prompt sources with planted defects and duplicates (and truth.jsonl labelling them), a
knowledge table of topics, mixed-quality SFT demonstrations, a gold judge (judge.py), simulated
annotators (annotators.py), and a tiny tokenizer and Llama config for the default models.

    rlhf world generate --seed 0 --out artifacts/world

Outputs under --out: sources/{human,user_queries,open_dataset}.jsonl, truth.jsonl,
demonstrations.jsonl, topics.json, tokenizer/, model_config/config.json, report.json.
Same seed and params -> byte-identical files.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlhf.pipeline import ranges


def _default_source_mix() -> dict[str, float]:
    return {"human": 0.3, "user_query": 0.5, "open_dataset": 0.2}


def _default_demo_mix() -> dict[str, float]:
    return {"good": 0.40, "filler": 0.15, "wrong_topic": 0.15, "repetitive": 0.12,
            "too_short": 0.09, "too_long": 0.09}


@dataclass(frozen=True)
class ModelShape:
    """The tiny Llama-style policy the SFT stage trains from scratch (about 1-5M parameters)."""
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 256

    def __post_init__(self):
        ranges.check_fields("model", self)


@dataclass(frozen=True)
class WorldConfig:
    seed: int = 0
    n_prompts: int = 3000  # source lines over the three files (defects and duplicates included)
    source_mix: dict[str, float] = field(default_factory=_default_source_mix)
    defect_rate: float = 0.2  # share of lines carrying a planted defect
    exact_dup_rate: float = 0.05  # share of lines that copy a clean prompt exactly
    paraphrase_rate: float = 0.1  # share of lines that reword a clean prompt (at least)
    long_prompt_words: int = 1400  # over-long prompts: > 4x a 256-token limit for any tokenizer
    n_demos: int = 3000
    demo_mix: dict[str, float] = field(default_factory=_default_demo_mix)
    tokenizer_vocab: int = 3000
    model: ModelShape = field(default_factory=ModelShape)

    def __post_init__(self):
        from rlhf.pipeline.world.demos import QUALITIES
        from rlhf.pipeline.world.sources import FILES

        ranges.check_fields("world", self)
        if self.defect_rate + self.exact_dup_rate + self.paraphrase_rate >= 1.0:
            raise ValueError("defect_rate + exact_dup_rate + paraphrase_rate must be < 1")
        if set(self.source_mix) != set(FILES) or sum(self.source_mix.values()) <= 0:
            raise ValueError(f"source_mix needs non-negative weights for exactly {list(FILES)}")
        if set(self.demo_mix) - set(QUALITIES) or sum(self.demo_mix.values()) <= 0:
            raise ValueError(f"demo_mix keys must be among {list(QUALITIES)}")


def _write_jsonl(path: Path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True).encode("utf-8")


def run(cfg: WorldConfig, out: Path) -> dict:
    """Generate the world into `out` (replacing what a previous run left); returns the report."""
    from rlhf.pipeline.world import demos, judge, sources, tokenizer
    from rlhf.pipeline.world.topics import TOPICS

    out = Path(out)
    for sub in ("sources", "tokenizer", "model_config"):
        shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    # Independent streams: changing the demo count does not change the sources, and vice versa.
    by_file, gen = sources.generate(
        random.Random(f"{cfg.seed}:sources"), cfg.n_prompts, dict(cfg.source_mix),
        cfg.defect_rate, cfg.exact_dup_rate, cfg.paraphrase_rate, cfg.long_prompt_words)
    for source, rows in by_file.items():
        _write_jsonl(out / sources.FILES[source], [r.to_bytes() for r in rows])
    _write_jsonl(out / "truth.jsonl", sources.truth_lines(gen["rows"]))

    demo_rows = demos.demonstrations(random.Random(f"{cfg.seed}:demos"), cfg.n_demos,
                                     dict(cfg.demo_mix))
    _write_jsonl(out / "demonstrations.jsonl", [_dumps(d) for d in demo_rows])

    topics = [{"name": t.name, "category": t.category, "high_risk": t.high_risk,
               "subject": t.subject, "keywords": list(t.keywords), "facts": list(t.facts),
               "questions": list(t.questions)} for t in TOPICS]
    (out / "topics.json").write_text(json.dumps(topics, indent=1, sort_keys=True,
                                                ensure_ascii=False) + "\n", encoding="utf-8")

    corpus = [d["prompt"] for d in demo_rows] + [d["response"] for d in demo_rows]
    corpus += [r.data["text"] for r in gen["rows"] if not r.expected]
    corpus += [q for t in TOPICS for q in t.questions] + [f for t in TOPICS for f in t.facts]
    vocab = tokenizer.train_tokenizer(corpus, cfg.tokenizer_vocab, out / "tokenizer")
    model = tokenizer.write_model_config(out / "model_config", out / "tokenizer",
                                         **asdict(cfg.model))

    quality: dict[str, list[float]] = {}
    for d in demo_rows:
        quality.setdefault(d["quality"], []).append(judge.gold_score(d["prompt"], d["response"]))
    report = {
        "seed": cfg.seed,
        "sources": gen["counts"],
        "topics": {"n": len(TOPICS), "high_risk": sum(t.high_risk for t in TOPICS),
                   "facts": sum(len(t.facts) for t in TOPICS),
                   "questions": sum(len(t.questions) for t in TOPICS)},
        "demonstrations": {
            "n": len(demo_rows),
            "gold_mean": round(statistics.fmean(s for v in quality.values() for s in v), 4),
            "by_quality": {q: {"n": len(v), "gold_mean": round(statistics.fmean(v), 4)}
                           for q, v in sorted(quality.items())},
        },
        "tokenizer": {"vocab_size": vocab},
        "model": model,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
    return report
