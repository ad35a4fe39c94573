"""The trainer's log-probability definition, shared by every sampling stage: log-probabilities,
entropies and the exact KL to a reference come from **full-vocabulary** distributions (seed 000
§5.4) of the logits divided by the sampling temperature (the distribution actually sampled), over
the response positions of a left-padded prompt followed by its right-padded response.

    python -c "from rlhf.pipeline.decode import token_logprobs; help(token_logprobs)"
"""

from __future__ import annotations

from rlhf.pipeline.decode.tokens import position_ids


def response_logits(model, query, query_mask, response, response_mask, temperature: float):
    """[B, T, V] logits / temperature at the T response positions of left-padded prompts
    ([B, P]) followed by right-padded responses ([B, T]): what scored the sampled tokens."""
    import torch

    ids = torch.cat([query, response], 1)
    mask = torch.cat([query_mask, response_mask.long()], 1)
    P, T = query.shape[1], response.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    return logits[:, P - 1: P - 1 + T].float() / (temperature + 1e-7)


def token_logprobs(logits, tokens):
    """[B, T] log-probability of each token under full-vocabulary softmax of `logits`."""
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits, tokens)


def token_entropy(logits):
    """[B, T] entropy (nats) of the full-vocabulary distribution at each position."""
    from trl.trainer.utils import entropy_from_logits

    return entropy_from_logits(logits)


def full_kl(logits, ref_logits):
    """[B, T] exact KL(pi || ref) = sum_v p_v (log p_v - log q_v) over the whole vocabulary."""
    import torch

    if logits.shape[-1] != ref_logits.shape[-1]:
        raise ValueError(
            f"policy and reference vocabularies differ ({logits.shape[-1]} vs "
            f"{ref_logits.shape[-1]}); the KL needs both full distributions (seed 000 §5.4)")
    logp = torch.log_softmax(logits.float(), dim=-1)
    logq = torch.log_softmax(ref_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)
