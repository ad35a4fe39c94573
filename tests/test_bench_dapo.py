"""DAPO's dynamic sampling on TRL's GRPO (bench/economy/peers.py): zero-variance groups are
dropped after scoring, the batch is refilled with new prompts' groups to its size, prompts
left-padded and completions right-padded to the widest, and every generation is counted."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from bench.economy import peers as economy_peers

GROUP = 2


class FakeGRPO:
    """Stands in for GRPOTrainer: each call 'generates' for its rows; a row's advantage is 0
    when its prompt is in `flat` (a group whose rewards do not vary)."""

    def __init__(self, flat: set[str], widths: list[tuple[int, int]]):
        self.model = SimpleNamespace(training=True)
        self.processing_class = SimpleNamespace(pad_token_id=0)
        self.flat, self.widths, self.calls = flat, list(widths), []

    def _generate_and_score_completions(self, inputs):
        self.calls.append([x["prompt_id"] for x in inputs])
        p, c = self.widths.pop(0)
        n = len(inputs)
        return {"prompt_ids": torch.ones(n, p, dtype=torch.long),
                "prompt_mask": torch.ones(n, p, dtype=torch.long),
                "completion_ids": torch.full((n, c), 5), "completion_mask": torch.ones(n, c),
                "advantages": torch.tensor([0.0 if x["prompt_id"] in self.flat else 1.0
                                            for x in inputs]),
                "num_items_in_batch": torch.tensor(n * c)}


def rows(*pids):
    return [{"prompt_id": p, "prompt": p, "raw_prompt": p} for p in pids for _ in range(GROUP)]


def test_flat_groups_are_dropped_and_the_batch_refilled():
    data = [{"prompt_id": f"n{i}", "prompt": "x", "raw_prompt": "x"} for i in range(10)]
    ledger = economy_peers.Ledger()
    cls = economy_peers.dynamic_sampling(FakeGRPO, data, GROUP, seed=0, max_gen_batches=4,
                                         ledger=ledger)
    t = cls({"a", "b"}, widths=[(3, 4), (5, 2)])
    out = t._generate_and_score_completions(rows("a", "b", "c", "d"))
    assert len(t.calls) == 2 and len(t.calls[1]) == 2 * GROUP  # two groups refilled
    assert ledger.groups_dropped == 2 and ledger.gen_batches_extra == 1
    assert out["prompt_ids"].shape == (8, 5) and out["completion_ids"].shape == (8, 4)
    assert bool((out["advantages"] != 0).all())  # only groups whose rewards vary are trained
    # the first batch's prompts were 3 wide: left-padded with the pad id and mask 0
    assert out["prompt_mask"][0].tolist() == [0, 0, 1, 1, 1]
    # the refill's completions were 2 wide: right-padded
    assert out["completion_mask"][-1].tolist() == [1, 1, 0, 0]
    assert int(out["num_items_in_batch"]) == 4 * 4 + 4 * 2


def test_after_the_last_try_flat_groups_fill_the_batch():
    data = [{"prompt_id": "a", "prompt": "x", "raw_prompt": "x"}]
    ledger = economy_peers.Ledger()
    cls = economy_peers.dynamic_sampling(FakeGRPO, data, GROUP, seed=0, max_gen_batches=2,
                                         ledger=ledger)
    t = cls({"a"}, widths=[(3, 3), (3, 3)])
    out = t._generate_and_score_completions(rows("a", "a"))
    assert len(t.calls) == 2 and out["advantages"].shape == (4,)
    assert ledger.groups_dropped == 4  # two in the batch, two in the refill (drawn again)
