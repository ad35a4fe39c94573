"""Schedules (λ-ε table, adaptive clip, KL warm-up) and diagnostics on hand-made sequences."""

from __future__ import annotations

import pytest

from rlhf.pipeline.ppo import diagnostics as dg
from rlhf.pipeline.ppo import schedules as sc


def test_lambda_eps_table_of_seed_000_3_3():
    assert sc.lambda_eps(0) == (0.92, 0.10)
    assert sc.lambda_eps(999) == (0.92, 0.10)
    assert sc.lambda_eps(1000) == (0.95, 0.15)
    assert sc.lambda_eps(4999) == (0.95, 0.15)
    assert sc.lambda_eps(5000) == (0.98, 0.08)
    assert sc.lambda_eps(10**6) == (0.98, 0.08)
    custom = ((0, 0.5, 0.3), (10, 0.6, 0.2))
    assert sc.lambda_eps(9, custom) == (0.5, 0.3) and sc.lambda_eps(10, custom) == (0.6, 0.2)
    for bad in [(), ((1, 0.9, 0.1),), ((0, 0.9, 0.1), (0, 0.9, 0.1)), ((0, 1.5, 0.1),),
                ((0, 0.9, 0.0),)]:
        with pytest.raises(ValueError):
            sc.lambda_eps(0, bad)


def test_adaptive_clip_of_seed_001_5_2():
    assert sc.adaptive_clip(0.5, base_clip=0.2) == 0.1
    assert sc.adaptive_clip(0.101, base_clip=0.2) == 0.1
    assert sc.adaptive_clip(0.019, base_clip=0.2) == 0.02
    assert sc.adaptive_clip(0.0, base_clip=0.2) == 0.02
    # between the thresholds: keep the scheduled ε, or interpolate continuously
    assert sc.adaptive_clip(0.05, base_clip=0.15) == 0.15
    assert sc.adaptive_clip(0.02, 0.15, between="interpolate") == pytest.approx(0.02)
    assert sc.adaptive_clip(0.06, 0.15, between="interpolate") == pytest.approx(0.06)
    assert sc.adaptive_clip(0.1, 0.15, between="interpolate") == pytest.approx(0.1)
    assert sc.adaptive_clip(0.3, 0.15, kl_low=0.1, kl_high=0.2, clip_low=0.05,
                            clip_high=0.25) == 0.25
    with pytest.raises(ValueError):
        sc.adaptive_clip(0.05, 0.1, kl_low=0.2, kl_high=0.1)
    with pytest.raises(ValueError):
        sc.adaptive_clip(0.05, 0.1, between="nearest")


def test_kl_warmup_and_controller_override():
    assert sc.kl_warmup(0, 0.2) == 0.0
    assert sc.kl_warmup(50, 0.2) == pytest.approx(0.1)
    assert sc.kl_warmup(100, 0.2) == pytest.approx(0.2)
    assert sc.kl_warmup(500, 0.2) == pytest.approx(0.2)
    assert sc.kl_warmup(3, 0.2, warmup_steps=0) == 0.2
    plain = sc.KLController(target=0.05)
    assert [plain.value(s) for s in (0, 50, 200)] == [0.05, 0.05, 0.05]
    ctl = sc.KLController(target=0.2, warmup_on=True, warmup_steps=10, override_steps=3)
    assert [ctl.value(s) for s in (0, 5, 10)] == pytest.approx([0.0, 0.1, 0.2])
    ctl.trigger_override(5)
    assert [ctl.value(s) for s in (5, 6, 7, 8)] == pytest.approx([2.0, 2.0, 2.0, 0.16])
    restored = sc.KLController(target=0.2, warmup_on=True, warmup_steps=10, override_steps=3)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value(7) == 2.0


def test_log_histogram_and_peak():
    counts = dg.log_histogram([1e-3, 1.1e-3, 2e-3, 1e-1, 0.0, float("nan")], -4, 0, 1.0)
    assert counts == [0, 3, 0, 1]  # bins [-4,-3), [-3,-2), [-2,-1), [-1,0]
    mon = dg.GradNormMonitor(log_min=-4, log_max=0, bin_width=1.0)
    assert mon.peak(counts) == -2.5


def test_peak_shift_up_suggests_larger_clip():
    mon = dg.GradNormMonitor(reference_steps=3, bin_width=0.5)
    for _ in range(3):  # reference: peak in the bin holding 1e-3
        out = mon.observe([1.2e-3] * 20 + [3e-5] * 2)
        assert out["suggestions"] == []
    out = mon.observe([1.5e-3] * 20)  # same place
    assert out["suggestions"] == [] and out["reference_log10"] == pytest.approx(-2.75)
    out = mon.observe([4e-3] * 20)  # half a decade up: not enough
    assert "increase_clip" not in out["suggestions"]
    out = mon.observe([1.2e-2] * 20 + [1e-3] * 5)  # peak moved 1e-3 -> 1e-2
    assert out["suggestions"] == ["increase_clip"]
    assert out["peak_log10"] - out["reference_log10"] == pytest.approx(1.0)
    state = mon.state_dict()
    other = dg.GradNormMonitor(reference_steps=3, bin_width=0.5)
    other.load_state_dict(state)
    assert other.observe([1.2e-2] * 20)["suggestions"] == ["increase_clip"]


def test_bimodal_histogram_suggests_smaller_lambda():
    mon = dg.GradNormMonitor(reference_steps=100)
    # the seed's picture: main peak at 1e-4, second peak at 1e-1
    out = mon.observe([1.1e-4] * 30 + [1.1e-1] * 8)
    assert out["bimodal"] and out["suggestions"] == ["decrease_lambda"]
    # unimodal, wide: no
    assert not mon.observe([10 ** (-4 + 0.1 * i) for i in range(30)])["bimodal"]
    # two peaks only one decade apart: no (separation < 2 decades)
    assert not mon.observe([1.1e-4] * 30 + [1.1e-3] * 10)["bimodal"]
    # far second peak too small (< 10% of the norms): no
    assert not mon.observe([1.1e-4] * 50 + [1.1e-1] * 3)["bimodal"]
    # a filled valley between the peaks: no
    filled = [1.1e-4] * 30 + [1.1e-1] * 8 + [10 ** x for x in (-3.4, -2.9, -2.4, -1.9, -1.4)] * 6
    assert not mon.observe(filled)["bimodal"]


def test_reward_collapse_detector_of_seed_000_5_1():
    det = dg.RewardCollapseDetector()
    assert det.observe(4.5, 0.5) is False  # first step: nothing to compare
    assert det.observe(4.4, 0.6) is False
    assert det.observe(0.1, 2.1) is True  # -98% mean, +250% std
    det = dg.RewardCollapseDetector()
    det.observe(4.0, 0.5)
    assert det.observe(2.9, 1.4) is False  # -27.5% mean: not enough
    det = dg.RewardCollapseDetector()
    det.observe(4.0, 0.5)
    assert det.observe(2.0, 1.4) is False  # +180% std: not enough
    det = dg.RewardCollapseDetector()
    det.observe(-1.0, 0.5)
    assert det.observe(-1.5, 1.6) is True  # negative means: drop measured against |mean|
    restored = dg.RewardCollapseDetector()
    restored.load_state_dict(det.state_dict())
    assert restored.prev == (-1.5, 1.6)
