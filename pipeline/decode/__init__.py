"""The decode room: how every stage turns prompts into sampled responses. One protocol
(`Generator`: left-padded prompts + `Sampling` + per-sequence hooks in, `Generated` out: token
ids, counted compute, the sampled tokens' log-probs), its engines (`hf`: `model.generate`;
`native`: our loop, in which a stopped row leaves the batch, optionally drafting), the sampling
(temperature, top-p, the exact draw), the drafters and the draft model.

Import from here only (`from rlhf.pipeline.decode import get_generator, Sampling`); the modules
behind these names are the package's own (tests/test_decode_package.py checks both directions:
nothing outside imports them, and nothing here imports the trainer or a stage).

| module | holds |
| --- | --- |
| `sampling.py` | `Sampling`, `top_p_sample` (the nucleus, drawn exactly) |
| `tokens.py` | `encode_prompts`, `cut_at_eos`, `pad_responses`, `position_ids` |
| `logprobs.py` | `response_logits`, `token_logprobs`, `token_entropy`, `full_kl` (the trainer's definitions) |
| `protocol.py` | `Generator`, `Generated` |
| `hf.py` | `HFGenerator`, `generate` (`model.generate` with our settings) |
| `native.py` | `NativeGenerator`, `native_generate`, `prefill` |
| `llama_step.py` | `FastDecoder`, the native loop's exact decode step for Llama / Qwen2 |
| `drafters.py` | `Drafter`, `DraftContext`, `LookupDrafter`, `ReuseDrafter`, `DRAFTS` |
| `draft_model.py` | `ModelDrafter` (the policy's first layers draft) |
| `drafted.py` | `DraftedGenerator`, `drafted_generate`, `resolve` (verification, accept rules) |
| `engines.py` | `get_generator`, `get_drafter`, `resolve_engine` (`auto` per device), `ENGINES` |
| `static.py` | `StaticGenerator`, `StaticStats`, `static_path`: the static-shape step (a CUDA graph per bucket) |
| `static_sample.py` | `StepSampling`, `warp`, `draw`: sampling inside the static step, no host sync; `warp_draw` (a CPU: `top_p_sample`) |
| `logprob_guard.py` | `LogprobGuard`, `LogprobMismatch`: the run-time check of reused engine log-probs |

    python -c "import rlhf.pipeline.decode as d; print(d.ENGINES, d.DRAFTS)"
"""

from rlhf.pipeline.decode.draft_model import ModelDrafter
from rlhf.pipeline.decode.drafted import DraftedGenerator, drafted_generate, resolve
from rlhf.pipeline.decode.drafters import DRAFTS, DraftContext, Drafter, LookupDrafter, ReuseDrafter
from rlhf.pipeline.decode.engines import ENGINES, get_drafter, get_generator, resolve_engine
from rlhf.pipeline.decode.hf import HFGenerator, generate
from rlhf.pipeline.decode.llama_step import FastDecoder
from rlhf.pipeline.decode.logprob_guard import LogprobGuard, LogprobMismatch
from rlhf.pipeline.decode.logprobs import full_kl, response_logits, token_entropy, token_logprobs
from rlhf.pipeline.decode.native import NativeGenerator, native_generate, prefill
from rlhf.pipeline.decode.protocol import Generated, Generator
from rlhf.pipeline.decode.sampling import Sampling, top_p_sample
from rlhf.pipeline.decode.static import StaticGenerator, StaticStats, static_path
from rlhf.pipeline.decode.static_sample import StepSampling, draw, warp, warp_draw
from rlhf.pipeline.decode.tokens import cut_at_eos, encode_prompts, pad_responses, position_ids

__all__ = [
    "DRAFTS", "DraftContext", "DraftedGenerator", "Drafter", "ENGINES", "FastDecoder", "Generated",
    "Generator", "HFGenerator", "LogprobGuard", "LogprobMismatch", "LookupDrafter", "ModelDrafter",
    "NativeGenerator", "ReuseDrafter", "Sampling", "StaticGenerator", "StaticStats",
    "StepSampling", "cut_at_eos", "drafted_generate", "draw", "encode_prompts", "full_kl",
    "generate", "get_drafter", "get_generator", "native_generate", "pad_responses",
    "position_ids", "prefill", "resolve", "resolve_engine", "response_logits", "static_path",
    "token_entropy", "token_logprobs", "top_p_sample", "warp", "warp_draw",
]
