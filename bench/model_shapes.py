"""The policy shapes the cost benchmarks build with random weights (bench/critic_bench.py,
bench/lora_bench.py `--scale`): the embedded world's (pipeline/world ModelShape) and Qwen2-0.5B's.

    python -c "import sys; sys.path.insert(0, 'bench'); from model_shapes import shape_config; \
print(shape_config('world'))"
"""

from __future__ import annotations

SCALES = {
    "world": dict(model="llama", vocab_size=3000, hidden_size=128, intermediate_size=384,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                  tie_word_embeddings=True, max_position_embeddings=256),
    "qwen05b": dict(model="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    tie_word_embeddings=True, max_position_embeddings=4096),
}


def shape_config(scale: str):
    """The transformers config of shape `scale` (a Llama or a Qwen2 config, sdpa attention, pad
    id 0)."""
    from transformers import LlamaConfig, Qwen2Config

    shape = dict(SCALES[scale])
    cls = Qwen2Config if shape.pop("model") == "qwen2" else LlamaConfig
    return cls(**shape, pad_token_id=0, attn_implementation="sdpa")
