"""Stopping criteria on drafted decoding: the generation time-out stops a drafted
generation as it stops the plain native one, and the trainer marks its unfinished rows timed
out; a criterion's per-row verdict stops that row only; given a hook's per-token criterion the
drafting engine decodes the batch plain (`draft_off_for_hooks`).

    RLHF_TORCH_THREADS=1 .venv/bin/python -m pytest -q tests/test_drafted_stops.py
"""

from __future__ import annotations

import pytest
import torch
from ppo_tiny import PROMPTS, policy, tokenizer
from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.decode import (
    LookupDrafter,
    Sampling,
    drafted_generate,
    encode_prompts,
    get_generator,
)
from rlhf.pipeline.ppo.accounting import StepCost
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.generate import generate_rollout
from transformers import StoppingCriteria


class StopRow(StoppingCriteria):
    """Stops one row (a per-row verdict, as a hook's criterion gives it) once it has a token."""

    def __init__(self, row: int, prompt_len: int):
        self.row, self.prompt_len = row, prompt_len

    def __call__(self, input_ids, scores, **kwargs):
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        done[self.row] = input_ids.shape[1] > self.prompt_len
        return done


@pytest.mark.parametrize("draft", ["lookup", "model"])
def test_the_generation_timeout_stops_a_drafted_generation(draft):
    """A defect of bba60c0: the drafted path got no stopping criteria, so a drafted generation ran
    on to max_new_tokens past `ppo.generation_timeout_s` and no row was marked timed out. A
    time-out that has passed before the first token now stops a drafted generation after it, as it
    stops the plain native one, and generate_rollout marks the unfinished rows timed out
    (fallback)."""
    tok = tokenizer()
    m = policy(tok)
    batch = [(f"p{i}", p) for i, p in enumerate(PROMPTS[:6])]
    rollouts = {}
    for d in ("none", draft):
        cfg = PPOConfig(engine="native", draft=d, draft_k=3, temperature=0.8, top_p=0.95,
                        max_new_tokens=12, max_prompt_tokens=16, generation_timeout_s=1e-9)
        torch.manual_seed(0)
        cost = StepCost()
        rollouts[d] = generate_rollout(m, tok, batch, cfg, "v0", "cpu", cost=cost)
        assert cost.gen_forwards == 1  # the prefill, then nothing: every row stopped
    for r in rollouts.values():
        assert r.extras["generated_tokens"] == [1] * 6
        timed_out = ["timeout" in f for f in r.flags]
        assert sum(timed_out) >= 4  # every row but one that drew eos first
        for i, t in enumerate(timed_out):  # a timed-out row falls back; an ended one is kept
            assert t != bool(r.valid[i])
            assert t or r.response[i][r.response_mask[i]].tolist() == [tok.eos_token_id]
    assert rollouts[draft].flags == rollouts["none"].flags


def test_drafted_rows_stop_on_their_own_criterion_verdict():
    """A criterion's per-row verdict stops that row only, after the first token and after a
    verification; the other rows draft on to the budget (greedy: the plain engine's tokens)."""
    tok = tokenizer()
    m = policy(tok)
    enc = encode_prompts(tok, PROMPTS[:6])
    s = Sampling(0.0, 1.0, 12)
    plain = get_generator("native").generate(m, tok, enc, s)
    P = enc["input_ids"].shape[1]
    made = drafted_generate(m, tok, enc, s, LookupDrafter(), k=4,
                            stopping_criteria=[StopRow(2, P)])
    lengths = (made.tokens != tok.pad_token_id).sum(1).tolist()
    assert lengths[2] == 1
    for i in (0, 1, 3, 4, 5):
        assert made.tokens[i].tolist() == plain.tokens[i].tolist()
    assert made.accepted > 0


def test_the_drafting_engine_decodes_plain_for_a_hooks_criterion():
    """`get_generator("native", draft=...)` drafts under the time-out alone; given a hook's
    per-token criterion it decodes the batch plain, with the criterion (the plain engine's own
    tokens under the same seed), says so, and the trainer counts it (`draft_off_for_hooks`)."""
    from transformers import MaxTimeCriteria

    tok = tokenizer()
    m = policy(tok)
    enc = encode_prompts(tok, PROMPTS[:6])
    s = Sampling(0.8, 0.95, 10)
    P = enc["input_ids"].shape[1]
    engine = get_generator("native", draft=LookupDrafter(), draft_k=3)
    drafted = engine.generate(m, tok, enc, Sampling(0.0, 1.0, 10),
                              stopping_criteria=[MaxTimeCriteria(600.0)])
    assert drafted.drafted > 0 and not drafted.draft_off
    torch.manual_seed(5)
    made = engine.generate(m, tok, enc, s, stopping_criteria=[MaxTimeCriteria(600.0),
                                                              StopRow(1, P)])
    torch.manual_seed(5)
    plain = get_generator("native").generate(m, tok, enc, s, stopping_criteria=[StopRow(1, P)])
    assert made.draft_off and made.drafted == 0
    assert made.tokens.tolist() == plain.tokens.tolist()
    assert (made.tokens[1] != tok.pad_token_id).sum() == 1
    cost = StepCost()
    cost.add_engine(made)
    cost.add_engine(plain)
    assert cost.features == {"draft_off_for_hooks": 1}
    with pytest.raises(ConfigError, match="need the native engine"):
        get_generator("hf", draft=LookupDrafter())
