"""A verifiable reward: arithmetic questions ("What is 3 + 4?") and whether a response's last
integer is their answer. The example of a reward that is code (docs/ppo.md): this module writes
the prompts, `rlhf ppo` calls `score` as its reward.

    python -m rlhf.pipeline.reward.rules.arithmetic arithmetic.jsonl --n 64 --seed 0
    rlhf ppo --policy artifacts/models/sft --prompts arithmetic.jsonl \
        --reward python:rlhf.pipeline.reward.rules.arithmetic:score \
        --out artifacts/ppo_arithmetic --rollouts artifacts/ppo_arithmetic/rollouts

The last integer, not the first: a response that works the sum out ("3 + 4 = 7") ends on its
answer, as the GSM8K-style verifiers read it. A prompt that is not such a question is not scored
(`valid` False): it earns no reward and stays out of the update, it is not a zero.

A conversation (a prompt with earlier turns, which `rlhf ppo` hands over as its message list:
code_rewards.as_source) asks what its last user turn asks: the response answers that turn, the
earlier ones are context. So "What is 3 + 4?" / "8" / "What is 2 * 5?" wants 10, and a last
turn that asks no sum ("Are you sure?") is not scored, even after one that did. In a text (a
single turn, or a whole conversation as a reward server gets it) the last question counts.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

# searched, not matched: the question may come wrapped in a template ("Human: ... Assistant:")
QUESTION = re.compile(r"\bwhat is (-?\d+) ([-+*]) (-?\d+)\s*\?", re.IGNORECASE)
INTEGER = re.compile(r"-?\d+")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def question(prompt: str | list[dict[str, str]]) -> str:
    """The text that asks: a single turn's text, or a conversation's last user turn; a message
    list with no user turn is a ValueError (one line, naming the roles it has)."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    if not users:
        roles = ", ".join(str(m.get("role")) for m in prompt) or "none"
        raise ValueError(f"arithmetic: a conversation with no user turn (roles: {roles})")
    return users[-1]


def answer(prompt: str | list[dict[str, str]]) -> int | None:
    """The answer to `What is a <op> b?` (the last one `question(prompt)` asks), or None when it
    asks no such question."""
    asked = QUESTION.findall(question(prompt))
    if not asked:
        return None
    a, op, b = asked[-1]
    return OPS[op](int(a), int(b))


def score(prompts: list[str | list[dict[str, str]]],
          responses: list[str]) -> tuple[list[float], list[bool]]:
    """(1.0 where the response's last integer is the answer else 0.0, valid: the prompt is an
    arithmetic question) for each row: the reward-function contract of code_rewards.py."""
    scores, valid = [], []
    for prompt, response in zip(prompts, responses):
        want = answer(prompt)
        said = INTEGER.findall(response)
        scores.append(1.0 if want is not None and said and int(said[-1]) == want else 0.0)
        valid.append(want is not None)
    return scores, valid


def make_prompts(n: int, seed: int = 0, max_operand: int = 9,
                 ops: str = "+-*") -> list[dict[str, str]]:
    """`n` questions {"prompt_id", "text"} with operands 0..max_operand, drawn with `seed`
    (the JSONL rows `rlhf ppo --prompts` reads)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        rows.append({"prompt_id": f"arith-{i:05d}", "text": f"What is {a} {op} {b}?"})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write arithmetic prompts as JSONL.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--ops", default="+-*", help="operators to draw from, e.g. '+-'")
    args = parser.parse_args(argv)
    if not args.ops or set(args.ops) - set(OPS):
        parser.error(f"--ops: use characters of {''.join(OPS)!r}")
    rows = make_prompts(args.n, args.seed, args.max_operand, args.ops)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
