"""The setup every job of a benchmark shares: the inputs (snapshotted, or read in place by the
DVC stages), the budget, the held-out prompts and their buckets, the judge; written to setup.json.

    .venv/bin/python -m bench.economy --dry-run --jobs 2   # prepares the setup, runs nothing
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from .arms import PEER_GROUP, QUICK_PPO, QUICK_STEPS, SETUP_KEY


def prepare(args, snapshot: bool = True) -> dict:
    """Snapshot the inputs under <out>/inputs (every job of a report reads the same files, even
    if the artifacts are regenerated meanwhile) and write <out>/setup.json; returns it. Without
    `snapshot` (the DVC stages, whose deps pin the artifacts) the artifacts are read in place,
    feature inputs from their pipeline paths, and setup.json hashes only what every arm reads."""
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.generate import sampling_of
    from rlhf.store.hashing import content_hash, tree_hash

    out = args.out
    inputs = out / "inputs"
    base = load_section(args.params, "ppo")
    if args.quick:
        from .world import build as build_world

        scratch = Path(tempfile.mkdtemp(prefix="economy-quick-"))
        world = build_world(scratch)
        src = {"sft": world["sft"], "rm_light": world["rm_light"], "pool": world["pool"]}
        held = [tuple(p) for p in json.loads(world["held_out"].read_text())]
        base = replace(base, **QUICK_PPO)
        strong = None
    else:
        from rlhf.pipeline.heldout_prompts import held_out_prompts

        a = args.artifacts
        src = {"sft": a / "models" / "sft", "rm_light": a / "models" / "rm_light",
               "pool": a / "store" / "pool"}
        if (a / "store" / "difficulty").is_dir():
            src["difficulty"] = a / "store" / "difficulty"
        if (a / "store" / "pool_embeddings").is_dir():  # the scheduler arm's prompt space
            src["pool_embeddings"] = a / "store" / "pool_embeddings"
        missing = [str(p) for p in src.values() if not p.exists()]
        if missing:
            raise SystemExit(f"missing inputs (run `dvc repro ppo` first): {', '.join(missing)}")
        held = held_out_prompts(a / "store")
        strong = a / "models" / "rm_strong" if (a / "models" / "rm_strong").is_dir() else None
    if not snapshot:
        return _write_setup(args, base, {k: v for k, v in src.items()
                                         if k not in SETUP_KEY}, held, strong)
    hashes = {k: tree_hash(v) if v.is_dir() else content_hash(v.read_text())[:16]
              for k, v in src.items()}
    # inputs only some arms read: in those arms' specs alone (spec_of), so adding one keeps
    # every other arm's saved results valid
    feature_hashes = {k: hashes.pop(k) for k in SETUP_KEY if k in hashes}
    if strong:  # Level 2 escalation reads it in place (263 MB): hashed, not copied
        feature_hashes["rm_strong"] = tree_hash(strong)
    old = json.loads((out / "setup.json").read_text()) if (out / "setup.json").exists() else {}
    inputs.mkdir(parents=True, exist_ok=True)
    old_hashes = {**old.get("hashes", {}), **old.get("feature_hashes", {})}
    for k, v in src.items():
        dst = inputs / v.name
        if old_hashes.get(k) != {**hashes, **feature_hashes}[k] or not dst.exists():
            shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
            (shutil.copytree if v.is_dir() else shutil.copy)(v, dst)
    if args.quick:
        shutil.rmtree(scratch, ignore_errors=True)
    extra_paths = {} if args.quick else tier_inputs(args, inputs, strong, feature_hashes)
    steps = args.steps or (QUICK_STEPS if args.quick else 2 * base.total_steps)
    tokens = args.tokens or steps * base.batch_size * base.max_new_tokens
    setup = {
        "judge": judge_setup(args), "params": str(args.params),
        "quick": bool(args.quick), "steps": steps, "token_budget": tokens, "points": args.points,
        "peer_group": PEER_GROUP,
        "paths": {**{k: str(inputs / v.name) for k, v in src.items()}, **extra_paths},
        "strong_reward": str(strong) if strong else None,
        "hashes": {**hashes, "held_out": content_hash(json.dumps(held))[:16]},
        "feature_hashes": feature_hashes,
        "held_out": held, "base_config": asdict(base), "budget_config": budget_config(base),
        # held-out prompt -> difficulty bucket (its own, else its cluster representative's)
        "held_out_buckets": ({} if args.quick else held_out_buckets(args.artifacts / "store",
                                                                   src.get("difficulty"), held)),
        # held-out gold sampled as PPO samples (the ppo stage's and the eval stage's one rule)
        "eval": {"n_prompts": len(held), **asdict(sampling_of(base)), "seed": base.eval_seed},
    }
    (out / "setup.json").write_text(json.dumps(setup, indent=1))
    return json.loads((out / "setup.json").read_text())  # as the jobs will read it


def _write_setup(args, base, src: dict, held: list, strong: Path | None) -> dict:
    """setup.json of the DVC stages: inputs in place (their hashes: the common ones only, the
    feature inputs are each arm stage's own deps)."""
    from rlhf.pipeline.ppo.generate import sampling_of
    from rlhf.store.hashing import content_hash, tree_hash

    a = args.artifacts
    steps = args.steps or 2 * base.total_steps
    tokens = args.tokens or steps * base.batch_size * base.max_new_tokens
    features = {"pool_embeddings": a / "store" / "pool_embeddings", "routes": a / "store" / "routes",
                "score_map": a / "models" / "rm_strong" / "score_map.json"}
    # no `base_config` here: each arm stage reads the ppo keys its run takes from params.yaml
    # itself (economy_dvc.arm_params), so a seed switch's default stales only the arms based on
    # the seed, never plain PPO's; setup.json holds the budget's keys alone (SETUP_PPO_KEYS)
    setup = {
        "judge": judge_setup(args), "params": str(args.params), "quick": False, "dvc": True,
        "steps": steps, "token_budget": tokens, "points": args.points, "peer_group": PEER_GROUP,
        "budget_config": budget_config(base),
        "paths": {**{k: str(v) for k, v in src.items()}, **{k: str(v) for k, v in
                                                            features.items() if v.exists()}},
        "strong_reward": str(strong) if strong else None,
        "hashes": {**{k: tree_hash(v) if v.is_dir() else content_hash(v.read_text())[:16]
                      for k, v in src.items()}, "held_out": content_hash(json.dumps(held))[:16]},
        "feature_hashes": {}, "held_out": held,
        "held_out_buckets": held_out_buckets(a / "store", src.get("difficulty"), held),
        "eval": {"n_prompts": len(held), **asdict(sampling_of(base)), "seed": base.eval_seed},
    }
    args.setup_path.parent.mkdir(parents=True, exist_ok=True)
    args.setup_path.write_text(json.dumps(setup, indent=1))
    return json.loads(args.setup_path.read_text())


def tier_inputs(args, inputs: Path, strong: Path | None, feature_hashes: dict) -> dict:
    """Issue 15's inputs, made once per results folder from the snapshot: the strong-to-light
    score map (the strong RM folder's, else fitted here exactly as the reward stage's on-policy
    step fits it: `reward.onpolicy_k` SFT samples per ppo prompt at PPO's sampling, both RMs'
    scores, `ScoreMap.fit`) and Level 0's routes (the route stage on the snapshot)."""
    from rlhf.pipeline.config import load_config
    from rlhf.store.hashing import content_hash, tree_hash

    out: dict = {}
    if strong is not None:
        path = inputs / "score_map.json"
        if (strong / "score_map.json").is_file():
            shutil.copy(strong / "score_map.json", path)
        elif not path.is_file():
            from rlhf.pipeline.decode import Sampling
            from rlhf.pipeline.models.policy import load_policy
            from rlhf.pipeline.reward import load_ensemble
            from rlhf.pipeline.reward.onpolicy import onpolicy_set
            from rlhf.pipeline.reward.score_map import ScoreMap
            from rlhf.pipeline.samplers import load_prompts

            rcfg, ppo = load_config(args.params, "reward"), load_config(args.params, "ppo")
            smp = Sampling(ppo.temperature, ppo.top_p, ppo.max_new_tokens)
            policy, tok = load_policy(inputs / "sft")
            prompts = [t for _, t in load_prompts(inputs / "pool")]
            print(f"fitting the strong-to-light score map on {len(prompts)} x {rcfg.onpolicy_k} "
                  "SFT samples", flush=True)
            data = onpolicy_set(policy, tok, prompts, rcfg.onpolicy_k, smp.temperature,
                                smp.top_p, smp.max_new_tokens, rcfg.seed + 3, rcfg.batch_size,
                                engine=rcfg.engine)
            s = load_ensemble(strong)(data.prompts, data.responses)[0].tolist()
            li = load_ensemble(inputs / "rm_light")(data.prompts, data.responses)[0].tolist()
            smap = ScoreMap.fit(s, li)
            smap.save(inputs)
            (inputs / "score_map_report.json").write_text(json.dumps(smap.report(s, li)))
        out["score_map"] = str(path)
        feature_hashes["score_map"] = content_hash(path.read_text())[:16]
    a = args.artifacts
    if (inputs / "pool_embeddings").is_dir() and (inputs / "difficulty").is_dir():
        from rlhf.pipeline.route import run as route

        topics = a / "world" / "topics.json"
        if not (inputs / "routes").is_dir():
            route(load_config(args.params, "router"), inputs / "pool", inputs / "pool_embeddings",
                  inputs / "difficulty", inputs / "routes", inputs / "router",
                  topics if topics.is_file() else None)
        out["routes"] = str(inputs / "routes")
        feature_hashes["routes"] = tree_hash(inputs / "routes")
    return out


WORLD_JUDGE = {"kind": "world_gold", "name": "world_gold"}


def judge_setup(args) -> dict:
    """params.yaml's `judge:` (the world's gold judge without one, and with --quick), its model
    folder (`--judge-model`, as the eval stage takes it) and what a result must match."""
    from rlhf.pipeline.config import read_params
    from rlhf.pipeline.models.judges import load_judge
    from rlhf.store.hashing import tree_hash

    if args.quick or "judge" not in read_params(args.params):
        return {"spec": WORLD_JUDGE}
    from rlhf.pipeline.config import load_config

    cfg = load_config(args.params, "judge")
    model = str(args.judge_model) if args.judge_model else None
    judge = load_judge(cfg, model)  # fails here, before any job, on a judge that cannot load
    src = Path(model or cfg.model) if cfg.kind != "world_gold" else None
    spec = {"kind": cfg.kind, "name": judge.name}
    if src is not None and src.is_dir():
        spec["model_hash"] = tree_hash(src)
    return {"spec": spec, "config": asdict(cfg), "model": model}


# the ppo keys the setup itself reads (the budget, the held-out sampling): the rest each arm
# stage reads on its own (economy_dvc.arm_params)
SETUP_PPO_KEYS = ("total_steps", "batch_size", "max_new_tokens", "temperature", "top_p",
                  "eval_seed")


def budget_config(base) -> dict:
    """The SETUP_PPO_KEYS of `base` (what the report's header and every arm share)."""
    return {k: getattr(base, k) for k in SETUP_PPO_KEYS}



def held_out_buckets(store: Path, difficulty: Path | None, held: list) -> dict[str, str]:
    """{held-out prompt id: difficulty bucket}: the difficulty table covers the pool (every
    split); a `similar` member takes its representative's bucket."""
    if difficulty is None:
        return {}
    from rlhf.store.io import read_table

    bucket = {r["prompt_id"]: r["bucket"] for r in
              read_table("difficulty", difficulty).select(["prompt_id", "bucket"]).to_pylist()}
    rep = {r["prompt_id"]: r["representative_id"] for r in
           read_table("similar", store / "similar").select(
               ["prompt_id", "representative_id"]).to_pylist()}
    out = {}
    for pid, _ in held:
        b = bucket.get(pid) or bucket.get(rep.get(pid, ""))
        if b is not None:
            out[pid] = b
    return out
