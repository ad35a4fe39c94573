"""The one prompt/response text format every model of the pipeline sees (SFT, reward models, PPO).

A policy is trained on `format_sample(prompt, response)` with the loss on the response part only,
generates after `format_prompt(prompt)`, and a reward model scores `format_sample(...)` of the
prompt and the generated response. Keeping the three in one place means a prompt is rendered the
same way at every stage: `format_sample(p, r)` always starts with `format_prompt(p)`, and the
response follows after one space, so with a byte-level BPE tokenizer the prompt ends on a token
boundary (the prompt's tokens are a prefix of the sample's tokens).

    python -c "from rlhf.pipeline.text import format_sample; print(format_sample('Hi?', 'Hello.'))"
"""

from __future__ import annotations

import re

HUMAN_TAG = "Human:"
ASSISTANT_TAG = "Assistant:"
RESPONSE_SEPARATOR = " "

_WS = re.compile(r"[ \t]+")


def clean(text: str) -> str:
    """Strip the ends and collapse runs of spaces/tabs (newlines inside a text are kept)."""
    return _WS.sub(" ", text).strip()


def format_prompt(prompt: str) -> str:
    """The text a policy continues: `Human: <prompt>\\nAssistant:` (no trailing space)."""
    return f"{HUMAN_TAG} {clean(prompt)}\n{ASSISTANT_TAG}"


def format_sample(prompt: str, response: str) -> str:
    """The text a policy is trained on and a reward model scores: prompt, one space, response."""
    return f"{format_prompt(prompt)}{RESPONSE_SEPARATOR}{clean(response)}"


def response_of(generated: str) -> str:
    """The response part of a decoded continuation of `format_prompt(...)`.

    A tiny policy may go on to write a new `Human:` turn; everything from there on is cut.
    """
    cut = generated.find(HUMAN_TAG)
    if cut >= 0:
        generated = generated[:cut]
    return clean(generated)


def split_dialogue(dialogue: str) -> tuple[str, str] | None:
    """(prompt, last assistant reply) of an hh-rlhf style `\\n\\nHuman: ... \\n\\nAssistant: ...` text.

    The prompt keeps the earlier turns (as plain text, `Human:`/`Assistant:` tags and all), so a
    multi-turn history is scored with its context. Returns None when there is no assistant turn.
    """
    marker = "\n\nAssistant:"
    cut = dialogue.rfind(marker)
    if cut < 0:
        return None
    history = dialogue[:cut].strip()
    reply = dialogue[cut + len(marker):].strip()
    if history.startswith(HUMAN_TAG):
        history = history[len(HUMAN_TAG):].strip()
    if not history:
        return None
    return history, reply
