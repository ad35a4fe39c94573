"""PPO with LoRA (`ppo.lora.enabled`): the policy trains as peft adapters on its frozen base; the
reference policy is that base with the adapters switched off (`disable_adapter`), so no second
copy of the weights is loaded; checkpoints hold the adapters. The trainer calls this module only
when `ppo.lora.enabled`; with it off nothing here runs and peft is never imported.

The critic keeps its `ppo.critic` options:
- `shared`: the value head reads the policy's own base (adapters off, no gradient) at layer
  `critic_layers`, through one trainable attention block: a value head on the same base, no
  copy of any layer.
- `full`: a model of its own (the policy's architecture and weights) with its own adapters and
  a value head.
- `trunk` (its own copy of the first layers, trained) and `light` (from scratch) as without LoRA.

    rlhf ppo ... -p params.yaml        # params.yaml: ppo.lora.enabled: true
    python bench/lora_bench.py         # trainable parameters and peak memory, plain vs LoRA
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhf.pipeline.models.lora import LoraConfig, wrap

WHERE = "ppo.lora"


class Reference:
    """The reference policy of a LoRA run: `model` (the peft policy) with its adapters disabled,
    in eval mode, without gradient. Not an nn.Module: the trainer's `ref.eval()` and
    `ref.requires_grad_(False)` must not reach the policy's adapters."""

    def __init__(self, model):
        self.model = model
        self.config = model.config

    def __call__(self, *args, **kwargs):
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.model.disable_adapter():
                return self.model(*args, **kwargs)
        finally:
            self.model.train(was)

    def eval(self):
        return self

    def requires_grad_(self, flag: bool = True):
        return self

    def to(self, *args, **kwargs):
        return self


def wrap_policy(policy, cfg: LoraConfig, policy_path: str | None = None):
    """(the policy with trainable adapters, its Reference). `policy_path`: the base's folder,
    named in the saved adapters' config (what `rlhf export --merge` loads them onto)."""
    model = wrap(policy, cfg, "CAUSAL_LM", WHERE)
    if policy_path is not None:
        model.peft_config["default"].base_model_name_or_path = str(policy_path)
    return model, Reference(model)


def build_critic(ppo_cfg, vocab: int, pad_id: int, policy, policy_path: str | None):
    """The critic of `ppo_cfg.critic` under LoRA (module docstring)."""
    from rlhf.pipeline.ppo.critic import PolicyTrunkCritic, build_critic as build

    kind = ppo_cfg.critic
    if kind == "shared":
        return PolicyTrunkCritic(policy.config, ppo_cfg.critic_layers, ppo_cfg.critic_max_tokens,
                                 pad_id, frozen=True, base=policy)
    critic = build(kind, vocab, pad_id, ppo_cfg.critic_hidden_size, ppo_cfg.critic_layers,
                   ppo_cfg.critic_heads, ppo_cfg.critic_max_tokens,
                   policy_source=policy_path if kind == "full" else None,
                   policy_config=policy.config)
    if kind == "full":
        critic.backbone = wrap(critic.backbone, ppo_cfg.lora, None, WHERE)
    return critic


def base_hidden_states(policy, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       layer: int) -> torch.Tensor:
    """The policy's base (adapters off, eval mode, no gradient) read after `layer` layers:
    [B, L, hidden]. Runs the body only, never the vocabulary-sized output head."""
    inner = policy.get_base_model()
    body = getattr(inner, inner.base_model_prefix)
    was = policy.training
    policy.eval()
    try:
        with torch.no_grad(), policy.disable_adapter():
            out = body(input_ids=input_ids, attention_mask=attention_mask,
                       output_hidden_states=True)
    finally:
        policy.train(was)
    return out.hidden_states[layer]


# --------------------------------------------------------------------------- checkpoints
def trained_weights(engine) -> dict:
    """What a checkpoint keeps of a LoRA run's model: its trainable tensors (the adapters, the
    critic's head and blocks); the frozen base is the policy folder the run started from."""
    return {k: p.detach().clone() for k, p in engine.model.named_parameters() if p.requires_grad}


def restore(engine, weights: dict, optim: dict) -> None:
    """Load `trained_weights` back into `engine`'s model (every trainable tensor, nothing else)
    and its optimiser state."""
    trainable = {k for k, p in engine.model.named_parameters() if p.requires_grad}
    if set(weights) != trainable:
        raise ValueError(f"the checkpoint's trained tensors are not this run's "
                         f"({len(weights)} saved, {len(trainable)} trainable): was it written "
                         f"with the same ppo.lora and ppo.critic?")
    _, unexpected = engine.model.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected[:3]
    engine.optimizer.load_state_dict(optim)


def save_merged(model, folder: Path) -> None:
    """The policy with its adapters merged (W + B·A·alpha/r, peft's `get_delta_weight`), as a
    plain model folder every stage loads; computed beside the model, which keeps its adapters."""
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    state = {k.replace(".base_layer", ""): v for k, v in inner.state_dict().items()
             if "lora_" not in k}
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer):
            key = f"{name}.weight"
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
            state[key] = state[key] + delta.to(state[key].dtype)
    inner.save_pretrained(folder, state_dict=state)


def save_adapter(model, folder: Path) -> None:
    """The policy's adapters as a peft folder (adapter_config.json names the base): what `rlhf
    export --merge` merges into the base. Adapters on the output head (a target peft counts
    as an embedding layer) save without the head itself: its base weights never change."""
    model.save_pretrained(folder, save_embedding_layers=False)
