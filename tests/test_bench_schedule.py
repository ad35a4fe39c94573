"""bench/economy's scheduler arm plumbing: the embeddings enter only the specs of
arms that read them (plain PPO's saved results stay valid), and the report section's figures
come from the saved per-run `schedule` figures."""

from __future__ import annotations

from bench.economy import results
from bench.economy import schedule as economy_schedule


def test_embeddings_hash_is_in_the_scheduler_arms_spec_only():
    setup = {"steps": 4, "points": 2, "token_budget": 10, "hashes": {"sft": "a"},
             "eval": {}, "base_config": {}, "feature_hashes": {"pool_embeddings": "e"}}
    assert "feature_hashes" not in results.spec_of(setup, "plain")
    assert results.spec_of(setup, "scheduler")["feature_hashes"] == {"pool_embeddings": "e"}
    old = dict(setup)
    old.pop("feature_hashes")  # a setup from before the arm existed: plain's spec is the same
    assert results.spec_of(old, "plain") == results.spec_of(setup, "plain")


def _result(trigger, skips, hard, stale_bias):
    return {"cost": {"rollouts_started": 100, "prompts_screened": skips},
            "points": [{"by_bucket": {"high": {"n": 5, "gold_mean": hard}}}],
            "schedule": {"decisions": 100 + skips, "skips": skips, "trigger_rate": trigger,
                         "reasons": {"low_variance": skips, "varied": 100},
                         "high_uncertainty_rows": 3, "by_window": {"1": {"n": 10,
                                                                        "skip_rate": 0.1}},
                         "by_bucket": {"high": {"n": 10, "skip_rate": 0.2}},
                         "by_cluster": {"0": {"n": 10, "skip_rate": 0.3}},
                         "staleness": {"skips": skips, "rolled_out_later": 2,
                                       "reward_bias": stale_bias, "gap_steps_mean": 4.0},
                         "sft_gold": {"by_bucket": {"high": {"n": 5, "gold_mean": 0.5}}}}}


def test_report_section_reads_the_saved_figures():
    runs = {"plain": [{"cost": {"rollouts_started": 100, "prompts_screened": 0},
                       "points": [{}]}],
            "scheduler": [_result(0.8, 25, 0.7, 0.1), _result(0.9, 11, 0.9, 0.3)]}
    text = "\n".join(economy_schedule.report_section(runs, "plain"))
    assert "## Rollout scheduler" in text
    row = [ln for ln in text.splitlines() if ln.startswith("| scheduler |")][0]
    assert "0.850 ± 0.050" in row and "36 / 236" in row and "4 / 36" in row
    assert "0.800 ± 0.100 (0.500; 5 prompts)" in row
    assert "`plain` trigger rate: 1.000" in text and "predate the per-bucket gold" in text
    assert "+0.200 ± 0.100" in text  # the staleness bias, mean over seeds ± SE
    assert economy_schedule.report_section({"plain": runs["plain"]}, "plain") == []
