"""The RM confidence measure: its definition, the 0.6 gate, the ensemble and the calibration."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf.pipeline.reward.confidence import (
    CONFIDENCE_GATE,
    accuracy_by_confidence,
    binary_entropy_bits,
    confidence_from_margins,
    fit_temperature,
    preference_probability,
    probability_at_confidence,
)


def test_binary_entropy_values():
    assert binary_entropy_bits(0.5) == pytest.approx(1.0)
    assert binary_entropy_bits(0.0) == 0.0 and binary_entropy_bits(1.0) == 0.0
    t = binary_entropy_bits(torch.tensor([0.5, 0.25, 1.0]))
    assert t.tolist() == pytest.approx([1.0, 0.811278, 0.0], abs=1e-5)


def test_confidence_definition_single_member():
    # margin 0: the RM cannot tell the direction -> confidence 0; a large margin -> ~1
    m = torch.tensor([0.0, math.log(3.0), -math.log(3.0), 20.0])
    conf = confidence_from_margins(m)
    p = 0.75  # sigmoid(log 3)
    expected = 1 + (p * math.log2(p) + (1 - p) * math.log2(1 - p))
    assert conf.tolist() == pytest.approx([0.0, expected, expected, 1.0], abs=1e-5)
    # symmetric in the sign of the margin, monotone in its size
    assert torch.all(confidence_from_margins(torch.tensor([0.5, 1.0, 2.0])).diff() > 0)


def test_gate_probability():
    p = probability_at_confidence(CONFIDENCE_GATE)
    assert p == pytest.approx(0.9206, abs=1e-4)
    assert 1 - binary_entropy_bits(p) == pytest.approx(CONFIDENCE_GATE, abs=1e-9)
    margin = math.log(p / (1 - p))  # the margin at which a single calibrated RM passes the gate
    assert float(confidence_from_margins(torch.tensor([margin * 1.01]))) > CONFIDENCE_GATE
    assert float(confidence_from_margins(torch.tensor([margin * 0.99]))) < CONFIDENCE_GATE


def test_ensemble_disagreement_lowers_confidence():
    agree = torch.tensor([[4.0], [4.0], [4.0]])
    disagree = torch.tensor([[4.0], [4.0], [-4.0]])
    assert float(confidence_from_margins(agree)) > 0.8
    assert float(confidence_from_margins(disagree)) < float(confidence_from_margins(agree))
    # the ensemble probability is the mean of the members' probabilities
    p = preference_probability(disagree)
    assert float(p) == pytest.approx((2 * torch.sigmoid(torch.tensor(4.0)) + torch.sigmoid(
        torch.tensor(-4.0))).item() / 3)


def test_temperature_scales_confidence():
    m = torch.tensor([1.0])
    assert float(confidence_from_margins(m, 0.5)) > float(confidence_from_margins(m, 2.0))


def test_fit_temperature_recovers_the_scale():
    # margins drawn so that P(chosen wins) = sigmoid(true / 1) while the RM reports 4 x true
    g = torch.Generator().manual_seed(0)
    true = torch.randn(20000, generator=g) * 2
    wins = torch.rand(20000, generator=g) < torch.sigmoid(true)
    reported = torch.where(wins, 4 * true, -4 * true)  # margin as seen from the chosen side
    t = fit_temperature(reported)
    assert t == pytest.approx(4.0, rel=0.15)


def test_accuracy_by_confidence_bins():
    margins = torch.tensor([0.1, -0.1, 5.0, 6.0, -7.0])
    rows = accuracy_by_confidence(margins)
    assert sum(r["n"] for r in rows) == 5
    low = rows[0]
    assert low["n"] == 2 and low["accuracy"] == 0.5
    top = rows[-1]
    assert top["n"] == 3 and top["accuracy"] == pytest.approx(2 / 3)
    assert rows[1]["accuracy"] is None
