"""The one prompt/response text format every model of the pipeline sees (SFT, reward models, PPO).

Two formats (params.yaml `text.prompt_format`: auto | template | plain; auto = `template` when the
tokenizer that encodes the text has a chat template, else `plain`), chosen per tokenizer by
`render_prompt` / `render_sample`, the functions every stage renders through:

- plain (the embedded world: its tiny tokenizer has no template), as below;
- template: `tokenizer.apply_chat_template(messages_of(prompt), add_generation_prompt=True)` for
  a prompt, the conversation with the response as the assistant's turn for a sample, encoded
  with `add_special_tokens=False` (`encode_kwargs`: the template writes its own BOS).

A stored prompt is one string; a multi-turn one (hh-rlhf, OpenAssistant, a user's `messages`
rows) holds its earlier turns in hh-rlhf's own notation, `first user turn\\n\\nAssistant: reply
\\n\\nHuman: next turn`: `messages_of` reads it back into a message list and `flatten` writes
one, so the conversation reaches a template turn by turn. In the plain format:

A policy is trained on `format_sample(prompt, response)` with the loss on the response part only,
generates after `format_prompt(prompt)`, and a reward model scores `format_sample(...)` of the
prompt and the generated response. Keeping the three in one place means a prompt is rendered the
same way at every stage: `format_sample(p, r)` always starts with `format_prompt(p)`, and the
response follows after one space, so with a byte-level BPE tokenizer the prompt ends on a token
boundary (the prompt's tokens are a prefix of the sample's tokens).

    python -c "from rlhf.pipeline.models.text import format_sample; print(format_sample('Hi?', 'Hello.'))"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

HUMAN_TAG = "Human:"
ASSISTANT_TAG = "Assistant:"
RESPONSE_SEPARATOR = " "

_WS = re.compile(r"[ \t]+")
_TURN = re.compile(r"\n\n(Human|Assistant):")
ROLES = {"user": HUMAN_TAG, "assistant": ASSISTANT_TAG}
PROMPT_FORMATS = ("auto", "template", "plain")


@dataclass
class TextConfig:
    """params.yaml `text:`: how a prompt becomes the text a model reads."""

    # auto: a tokenizer's chat template when it has one, else plain "Human: ... Assistant:";
    # template: always the chat template (a tokenizer without one is an error); plain: never
    prompt_format: Literal["auto", "template", "plain"] = "auto"


# the running stage's text.prompt_format (`use_prompt_format`); "auto" for library use
_prompt_format = "auto"


def use_prompt_format(prompt_format: str) -> str:
    """Set the format every later `render_*` call uses (a stage's `text.prompt_format`); returns
    the previous one."""
    global _prompt_format
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"text.prompt_format must be one of {PROMPT_FORMATS}, got "
                         f"{prompt_format!r}")
    previous, _prompt_format = _prompt_format, prompt_format
    return previous


def prompt_format() -> str:
    """The format `render_*` calls use now (what a stage's worker processes are given)."""
    return _prompt_format


def templated(tokenizer) -> bool:
    """Whether texts for `tokenizer` are rendered with its chat template (`text.prompt_format`:
    template, or auto and the tokenizer has one); "template" without one is a ValueError."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if _prompt_format == "template" and not has:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"text.prompt_format is 'template' but the tokenizer {name} has no "
                         "chat template (set text.prompt_format: plain or auto)")
    return has and _prompt_format != "plain"


def clean(text: str) -> str:
    """Strip the ends and collapse runs of spaces/tabs (newlines inside a text are kept)."""
    return _WS.sub(" ", text).strip()


def format_prompt(prompt: str) -> str:
    """The text a policy continues: `Human: <prompt>\\nAssistant:` (no trailing space)."""
    return f"{HUMAN_TAG} {clean(prompt)}\n{ASSISTANT_TAG}"


def format_sample(prompt: str, response: str) -> str:
    """The text a policy is trained on and a reward model scores: prompt, one space, response."""
    return f"{format_prompt(prompt)}{RESPONSE_SEPARATOR}{clean(response)}"


def messages_of(prompt: str) -> list[dict[str, str]]:
    """The conversation a stored prompt holds: its first turn is the user's, later turns follow
    `\\n\\nHuman:` / `\\n\\nAssistant:` (hh-rlhf's notation; a leading tag is allowed)."""
    parts = _TURN.split(prompt)
    head = parts[0].strip().removeprefix(HUMAN_TAG)
    messages = [{"role": "user", "content": clean(head)}] if head.strip() else []
    for i in range(1, len(parts) - 1, 2):
        role = "user" if parts[i] == "Human" else "assistant"
        messages.append({"role": role, "content": clean(parts[i + 1])})
    return messages


def flatten(messages: list[dict[str, str]]) -> str:
    """The stored prompt of a conversation (`messages_of` reads it back): user and assistant
    turns, the first one the user's. A ValueError names what does not fit."""
    if not messages or messages[0].get("role") != "user":
        raise ValueError("a conversation starts with a user message")
    for m in messages:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"a message is {{'role': 'user' | 'assistant', 'content': str}}, "
                             f"got {m!r}")
    rest = "".join(f"\n\n{ROLES[m['role']]} {clean(m['content'])}" for m in messages[1:])
    return clean(messages[0]["content"]) + rest


def render_prompt(prompt: str, tokenizer=None) -> str:
    """The text a policy continues: `format_prompt(prompt)`, or the chat template's rendering of
    the conversation with the generation prompt (`templated`)."""
    if tokenizer is None or not templated(tokenizer):
        return format_prompt(prompt)
    return tokenizer.apply_chat_template(messages_of(prompt), tokenize=False,
                                         add_generation_prompt=True)


def render_sample(prompt: str, response: str, tokenizer=None) -> str:
    """The text a reward model scores (a policy is trained on): `format_sample`, or the chat
    template's rendering of the conversation ending with the response as the assistant's turn."""
    if tokenizer is None or not templated(tokenizer):
        return format_sample(prompt, response)
    turns = messages_of(prompt) + [{"role": "assistant", "content": clean(response)}]
    return tokenizer.apply_chat_template(turns, tokenize=False)


def response_offset(prompt: str, tokenizer=None) -> int:
    """Where the response starts in `render_sample(prompt, response, tokenizer)` (characters):
    after the plain prompt and its separator, or after the template's generation prompt."""
    if tokenizer is None or not templated(tokenizer):
        return len(format_prompt(prompt)) + len(RESPONSE_SEPARATOR)
    return len(render_prompt(prompt, tokenizer))


def encode_kwargs(tokenizer) -> dict:
    """Keyword arguments for encoding a rendered text: a template writes its own special tokens
    (BOS), so the tokenizer adds none; the plain format keeps the tokenizer's default."""
    return {"add_special_tokens": False} if templated(tokenizer) else {}


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
