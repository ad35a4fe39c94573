"""Rewards PPO reads besides a reward-model folder: a Python function, or a reward model behind
an HTTP server. `scoring.load_scorer` reads the `rlhf ppo --reward` spec and comes here for:

- `python:path/to/file.py:function` or `python:package.module:function`: a callable
  `function(prompts, responses: list[str])` returning one score a row (a list, a 1-D numpy
  array or tensor), or a pair `(scores, valid)` whose `valid` (one bool a row) marks the rows it
  scored; a score of None also means "not scored" (TRL's reward_funcs). Each prompt comes as its
  source held it (`as_source`), whatever template the policy reads it in: a conversation (a
  prompt with earlier turns: hh-rlhf, OpenAssistant, a user's `messages` rows) as its message
  list `[{"role": "user" | "assistant", "content": str}, ...]` ending on the user's turn, a
  single turn as its text; a response is the text the policy wrote. A file is loaded by path as
  OpenRLHF loads agent code (`importlib.util.spec_from_file_location`).
- `http://host:port/path` (or https): OpenRLHF's remote reward model contract (`--remote_rm_url`,
  openrlhf/cli/serve_rm.py): POST {"query": [prompt and response as the policy saw them: the
  conversation with the response as the assistant's turn, in the policy's chat template where
  it has one (`text.render_sample`), else "Human: ... Assistant: ..."], "prompts": [the prompt
  as the policy read it, with the template's generation prompt (`text.render_prompt`)],
  "responses": [the response]} as JSON, answer {"rewards": [one number a row]} and optionally
  "valid": [one bool a row]. `rlhf ppo` and `rlhf eval` give the scorer the policy's tokenizer
  (`load_scorer(..., policy_tokenizer=)`; None: the plain format). A request that times out,
  cannot connect or gets a 5xx / 429 is retried with exponential backoff.

A row the reward did not score earns none: it leaves the update like a fallback rollout and the
store keeps a null reward with scorer "unscored" (pipeline/ppo/records.py). Anything else (an
exception, a wrong type, length or shape, NaN, a server that keeps failing) is a `RewardError`:
one line naming the function or URL, never a silent zero. Such a reward has no confidence (1.0),
no per-token scores and no weights, so the features that read those refuse it at start
(`check_features`, pipeline/ppo/scoring.py). Its calls and tokens (whitespace words: it has no
tokenizer of ours) count in `StepCost` as the light RM's; the `rollouts` and `rm_scores` rows
name it in `rm_version`.

    python -c "from rlhf.pipeline.models.code_rewards import load; \
s = load('python:rlhf.pipeline.reward.rules.arithmetic:score'); \
print(s.score(['What is 3 + 4?'], ['7']))"
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import math
import numbers
import sys
import time
from pathlib import Path

import torch

from rlhf.pipeline.models.text import messages_of, render_prompt, render_sample

PYTHON, HTTP = "python:", ("http://", "https://")
# The server client's defaults, not params.yaml keys (a new `ppo:` key would make the ppo stage
# stale for every run): OpenRLHF's client waits 180 s and tries 5 times, 1 s apart; we wait
# less per try and back off (1, 2, 4 s) so a restarting server gets time to come back.
TIMEOUT_S, RETRIES, BACKOFF_S = 60.0, 3, 1.0


class RewardError(ValueError):
    """A reward function or server failed or answered badly (one line, naming it)."""


def kind(spec: str | Path) -> str:
    """Which of the three `--reward` kinds `spec` is: python, http or folder."""
    text = str(spec)
    if text.startswith(PYTHON):
        return "python"
    return "http" if text.startswith(HTTP) else "folder"


def load(spec: str | Path, policy_tokenizer=None):
    """The scorer of a `python:` or `http(s)://` spec (`scoring.load_scorer` does folders); a
    server renders its texts in `policy_tokenizer`'s chat template (`ServerScorer`)."""
    spec = str(spec)
    if kind(spec) == "http":
        return ServerScorer(spec, policy_tokenizer=policy_tokenizer)
    return FunctionScorer(*load_function(spec), spec=spec)


@functools.cache
def load_function(spec: str):
    """(function, version) of `python:target:function`; version: `spec@` the first 16 hex digits
    of the sha256 of the source file (a module without a file: the spec alone). Loaded once a
    process: `rlhf ppo` loads it before the models to fail fast, the trainer then gets the same."""
    target, sep, name = spec[len(PYTHON):].rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise RewardError(f"--reward {spec}: expected python:path/to/file.py:function or "
                          "python:package.module:function")
    try:
        module = _import(target, spec)
    except RewardError:
        raise
    except Exception as exc:  # the user's module: any failure is theirs to see, in one line
        raise RewardError(f"--reward {spec}: importing {target} failed: {_one_line(exc)}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardError(f"--reward {spec}: {target} has no function {name!r}")
    source = getattr(module, "__file__", None)
    digest = (hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16]
              if source and Path(source).is_file() else None)
    return fn, f"{spec}@{digest}" if digest else spec


def _import(target: str, spec: str):
    """The module `target` names: a .py file loaded by path (under a name of its own, so two
    files called rewards.py do not collide), else an importable dotted name."""
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target)
    if not path.is_file():
        raise RewardError(f"--reward {spec}: no such file {path}")
    name = "rlhf_reward_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    loader = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module  # what dataclasses and pickling inside it look up
    loader.loader.exec_module(module)
    return module


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def checked(out, n: int, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores float32 [n], valid bool [n]) of what a reward returned; a RewardError naming `who`
    for anything but n finite numbers (None: not scored) and optionally n bools."""
    valid = None
    if isinstance(out, tuple) and len(out) == 2 and not _is_number(out[0]) and out[0] is not None:
        out, valid = out
    rows = _rows(out, n, who, "scores")
    scores = torch.zeros(n, dtype=torch.float32)
    ok = torch.ones(n, dtype=torch.bool)
    for i, x in enumerate(rows):
        if x is None:
            ok[i] = False
        elif not _is_number(x):
            raise RewardError(f"{who} returned a {type(x).__name__} for row {i}, not a number")
        elif not math.isfinite(float(x)):
            raise RewardError(f"{who} returned {float(x)} for row {i}")
        else:
            scores[i] = float(x)
    if valid is not None:
        for i, v in enumerate(_rows(valid, n, who, "validity flags")):
            v = v.item() if hasattr(v, "item") else v  # a numpy or torch bool
            if not isinstance(v, bool | numbers.Integral) or v not in (0, 1):
                raise RewardError(f"{who} returned validity {v!r} for row {i}, not a bool")
            ok[i] &= bool(v)
    scores[~ok] = 0.0
    return scores, ok


def _is_number(x) -> bool:
    """A Python or numpy real, or a 0-d tensor / array."""
    return isinstance(x, numbers.Real) or getattr(x, "shape", None) in ((), torch.Size([]))


def _rows(out, n: int, who: str, what: str) -> list:
    if torch.is_tensor(out) or hasattr(out, "tolist") and hasattr(out, "shape"):
        if len(out.shape) != 1:
            raise RewardError(f"{who} returned {what} of shape {tuple(out.shape)}, expected ({n},)")
        out = out.tolist()
    if isinstance(out, str | bytes | dict) or not hasattr(out, "__len__"):
        raise RewardError(f"{who} returned {type(out).__name__}, expected {n} {what} (a list)")
    if len(out) != n:
        raise RewardError(f"{who} returned {len(out)} {what} for {n} responses")
    return list(out)


def as_source(prompt: str) -> str | list[dict[str, str]]:
    """A stored prompt as its source held it: a conversation (the prompt holds earlier turns, in
    hh-rlhf's notation: text.py) as its message list, a single turn as its text. (A one-turn
    `messages` row is stored as its text: the two cannot be told apart, and reach a template
    the same way.)"""
    messages = messages_of(prompt)
    return messages if len(messages) > 1 else prompt


class FunctionScorer:
    """A Python reward function as a scorer: `score` -> (scores, confidence 1.0, valid)."""

    name = "light_rm"

    def __init__(self, fn, version: str, spec: str):
        self.fn, self.version, self.spec = fn, version, spec
        self.who = f"reward function {spec}"

    def score(self, prompts: list[str], responses: list[str]):
        try:
            out = self.fn([as_source(p) for p in prompts], list(responses))
        except Exception as exc:  # the user's code: its failure is one line naming it
            raise RewardError(f"{self.who} raised {_one_line(exc)}") from exc
        scores, valid = checked(out, len(prompts), self.who)
        return scores, torch.ones_like(scores), valid


class ServerScorer:
    """A reward model server (OpenRLHF's remote RM contract) as a scorer; its version is its URL
    (what the server runs is not ours to hash). `policy_tokenizer`: the policy's, whose chat
    template the texts it sends are rendered in (None: the plain format)."""

    name = "light_rm"

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S, retries: int = RETRIES,
                 backoff_s: float = BACKOFF_S, policy_tokenizer=None):
        self.url, self.version, self.policy_tokenizer = url, url, policy_tokenizer
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.who = f"reward server {url}"

    def score(self, prompts: list[str], responses: list[str]):
        tok = self.policy_tokenizer
        body = {"query": [render_sample(p, r, tok) for p, r in zip(prompts, responses)],
                "prompts": [render_prompt(p, tok) for p in prompts], "responses": list(responses)}
        answer = self.post(json.dumps(body).encode("utf-8"))
        if not isinstance(answer, dict) or "rewards" not in answer:
            raise RewardError(f"{self.who} answered without \"rewards\": {str(answer)[:120]}")
        out = (answer["rewards"], answer["valid"]) if "valid" in answer else answer["rewards"]
        scores, valid = checked(out, len(prompts), self.who)
        return scores, torch.ones_like(scores), valid

    def post(self, data: bytes):
        """The JSON answer to one POST; a transient failure (no connection, a timeout, 5xx, 429)
        is retried `retries` times after 1, 2, 4, ... x `backoff_s` seconds."""
        import urllib.error
        import urllib.request

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(self.url, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as exc:
                detail = " ".join(exc.read().decode("utf-8", "replace").split())[:120]
                last = f"HTTP {exc.code}" + (f" ({detail})" if detail else "")
                if exc.code < 500 and exc.code != 429:  # our request is wrong: retrying won't fix it
                    raise RewardError(f"{self.who} refused the request: {last}") from exc
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)  # URLError wraps the socket's error
                timed_out = isinstance(reason, TimeoutError)
                last = (f"no answer within {self.timeout_s:g}s" if timed_out
                        else _one_line(reason) if isinstance(reason, BaseException)
                        else str(reason))
                continue
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise RewardError(f"{self.who} answered with no JSON: "
                                  f"{raw[:80].decode('utf-8', 'replace')!r}") from exc
        raise RewardError(f"{self.who} failed {self.retries + 1} times (timeout {self.timeout_s:g}s"
                          f", {self.retries} retries with backoff); last: {last}")
