"""The two `rlhf ppo --reward` kinds besides an RM folder (pipeline/models/code_rewards.py): a
Python function (a file or a module, its errors one line naming it) and a reward server
(OpenRLHF's remote RM contract) tested against real HTTP servers on 127.0.0.1, and the shipped
arithmetic rule (pipeline/reward/rules/arithmetic.py) run through `rlhf ppo` on a tiny policy."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import ppo_tiny
import pytest
from rlhf.pipeline.models import code_rewards
from rlhf.pipeline.models.code_rewards import RewardError, ServerScorer
from rlhf.pipeline.models.scoring import load_scorer
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.scoring import check_features
from rlhf.pipeline.reward.rules import arithmetic
from typer.testing import CliRunner

ARITH = "python:rlhf.pipeline.reward.rules.arithmetic:score"


# --------------------------------------------------------------------------- the rule
def test_arithmetic_rule_checks_the_last_integer_and_skips_other_prompts():
    scores, valid = arithmetic.score(
        ["What is 3 + 4?", "what is 2 * 5?", "What is 1 - 3?", "Human: What is 6 + 6?\nAssistant:",
         "tell me about the cat", "What is 3 + 4?"],
        ["7", "3 + 4 = 10", "-2", "the answer is 12 .", "7", "eight"])
    assert scores == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert valid == [True, True, True, True, False, True]
    rows = arithmetic.make_prompts(20, seed=3, max_operand=4, ops="+")
    assert rows == arithmetic.make_prompts(20, seed=3, max_operand=4, ops="+")  # seeded
    assert all(0 <= arithmetic.answer(r["text"]) <= 8 for r in rows)


def test_arithmetic_rule_asks_a_conversations_last_user_turn():
    """A multi-turn prompt reaches the function as its message list (code_rewards.as_source):
    the question is the last user turn, the earlier turns are context; a message list with no
    user turn is one line naming its roles."""
    def conversation(*turns: str) -> str:  # as ingest stores it (hh-rlhf's notation)
        return "".join(f"\n\n{'Assistant' if i % 2 else 'Human'}: {t}"
                       for i, t in enumerate(turns)).removeprefix("\n\nHuman: ")

    rule = load_scorer(ARITH)
    prompts = [conversation("What is 3 + 4?", "8", "What is 2 * 5?"),
               conversation("What is 3 + 4?", "8", "What is 2 * 5?"),
               conversation("What is 3 + 4?", "8", "Are you sure?"),
               conversation("tell me about the cat", "It purrs.", "What is 6 - 9?"),
               "What is 3 + 4?"]
    assert isinstance(code_rewards.as_source(prompts[0]), list)
    scores, _, valid = rule.score(prompts, ["10", "7", "7", "the answer is -3", "7"])
    assert scores.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert valid.tolist() == [True, True, False, True, True]
    with pytest.raises(ValueError) as err:
        arithmetic.score([[{"role": "assistant", "content": "What is 1 + 1?"}]], ["2"])
    assert str(err.value) == "arithmetic: a conversation with no user turn (roles: assistant)"


def test_arithmetic_prompts_command_writes_jsonl(tmp_path):
    arithmetic.main([str(tmp_path / "p.jsonl"), "--n", "5", "--seed", "1"])
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [f"arith-{i:05d}" for i in range(5)]
    assert all(arithmetic.answer(r["text"]) is not None for r in rows)


# --------------------------------------------------------------------------- functions
def _module(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text("import math\nimport numpy as np\n\n" + body)
    return path


def test_a_function_by_file_and_by_module_is_named_and_versioned(tmp_path):
    path = _module(tmp_path, "def reward(prompts, responses):\n"
                             "    return np.array([len(r) for r in responses], dtype=float)\n")
    s = load_scorer(f"python:{path}:reward")
    scores, conf, valid = s.score(["a", "b"], ["xyz", "x"])
    assert scores.tolist() == [3.0, 1.0] and conf.tolist() == [1.0, 1.0]
    assert valid.tolist() == [True, True] and s.name == "light_rm"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert s.version == f"python:{path}:reward@{digest}"
    m = load_scorer(ARITH, name="light_rm")
    assert m.version.startswith(ARITH + "@") and m.score(["What is 3 + 4?"], ["7"])[0] == 1.0


def test_a_function_gets_a_conversation_as_its_messages_and_a_single_turn_as_its_text(tmp_path):
    """The prompts as their source held them, not in the store's hh-rlhf notation nor in any
    template: TRL's reward_funcs get a conversational dataset's message lists."""
    from test_chat_templates import MULTI, MULTI_MESSAGES, SINGLE

    path = _module(tmp_path, "SEEN = []\n\ndef f(prompts, responses):\n"
                             "    SEEN.append((prompts, responses))\n"
                             "    return [float(len(p)) for p in prompts]\n")
    scores, _, _ = load_scorer(f"python:{path}:f").score([MULTI, SINGLE], ["Blue.", "Air."])
    seen = code_rewards.load_function(f"python:{path}:f")[0].__globals__["SEEN"]
    assert seen == [([MULTI_MESSAGES, SINGLE], ["Blue.", "Air."])]
    assert scores.tolist() == [3.0, float(len(SINGLE))]


def test_a_none_score_or_a_false_validity_leaves_the_row_unscored(tmp_path):
    path = _module(tmp_path, "def none(p, r):\n    return [1.5, None, -2]\n"
                             "def pair(p, r):\n    return [0.5, 0.25, 1], np.array([1, 0, 1], bool)\n")
    for fn, want in (("none", [1.5, 0.0, -2.0]), ("pair", [0.5, 0.0, 1.0])):
        scores, _, valid = load_scorer(f"python:{path}:{fn}").score(list("abc"), list("xyz"))
        assert scores.tolist() == want and valid.tolist() == [True, False, True]


BAD = {
    "raises": ("def f(p, r):\n    raise KeyError('no answer')\n", "raised KeyError: 'no answer'"),
    "short": ("def f(p, r):\n    return [1.0]\n", "returned 1 scores for 2 responses"),
    "nan": ("def f(p, r):\n    return [1.0, math.nan]\n", "returned nan for row 1"),
    "text": ("def f(p, r):\n    return ['1', 2]\n", "returned a str for row 0, not a number"),
    "matrix": ("def f(p, r):\n    return np.ones((2, 1))\n", "shape (2, 1), expected (2,)"),
    "scalar": ("def f(p, r):\n    return 1.0\n", "returned float, expected 2 scores"),
    "validity": ("def f(p, r):\n    return [1, 2], ['yes', 'no']\n", "validity 'yes' for row 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_function_is_one_error_naming_it(tmp_path, case):
    body, message = BAD[case]
    spec = f"python:{_module(tmp_path, body)}:f"
    with pytest.raises(RewardError) as err:
        load_scorer(spec).score(["a", "b"], ["x", "y"])
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"reward function {spec} ") and message in text


def test_a_bad_spec_is_one_error_naming_it(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(p, r:\n")
    cases = {f"python:{tmp_path / 'nope.py'}:f": "no such file",
             f"python:{broken}:f": "importing", "python:rlhf.no_such_module:f": "importing",
             f"python:{_module(tmp_path, 'x = 1')}:f": "has no function 'f'",
             "python:f": "expected python:path/to/file.py:function"}
    for spec, message in cases.items():
        with pytest.raises(RewardError) as err:
            load_scorer(spec)
        assert str(err.value).startswith(f"--reward {spec}: ") and message in str(err.value)
        assert "\n" not in str(err.value)


def test_features_that_read_an_rm_refuse_a_reward_that_is_code():
    for switch in ({"escalate_below": 0.5}, {"rm_gate_mask_on": True},
                   {"rm_evolve_on": True}, {"reward_attention_on": True},
                   {"human_labels_per_step": 1}):
        cfg = PPOConfig(**switch)
        for spec in (ARITH, "http://127.0.0.1:1/score"):
            with pytest.raises(ValueError, match=f"ppo.{next(iter(switch))} .*needs"):
                check_features(cfg, spec)
        check_features(cfg, "artifacts/models/rm_light")  # a folder: fine
    check_features(PPOConfig(resample_on=True), ARITH)  # whole-response resample


# --------------------------------------------------------------------------- servers
class Server:
    """A real HTTP server on 127.0.0.1 in a thread; `answer(body, hit) -> (status, payload)`
    decides each reply (payload: an object sent as JSON, or bytes sent as they are)."""

    def __init__(self, answer, delay_s: float = 0.0):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's name for it
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                time.sleep(delay_s)
                status, payload = answer(body, len(outer.bodies))
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    @property
    def hits(self) -> int:
        return len(self.bodies)


def arithmetic_server(body, hit):
    scores, valid = arithmetic.score(body["prompts"], body["responses"])
    return 200, {"rewards": scores, "valid": valid}


def _client(url: str, **kw) -> ServerScorer:
    return ServerScorer(url, **{"timeout_s": 5.0, "retries": 2, "backoff_s": 0.01, **kw})


def test_a_server_gets_openrlhf_batches_and_its_scores_are_used():
    with Server(arithmetic_server) as srv:
        s = load_scorer(srv.url)
        scores, _, valid = s.score(["What is 3 + 4?", "hi", "What is 2 * 2?"], ["7", "7", "5"])
    assert scores.tolist() == [1.0, 0.0, 0.0] and valid.tolist() == [True, False, True]
    assert s.version == srv.url and s.name == "light_rm" and srv.hits == 1
    body = srv.bodies[0]
    assert body["query"][0] == "Human: What is 3 + 4?\nAssistant: 7"  # what an RM reads
    assert body["prompts"][0] == "Human: What is 3 + 4?\nAssistant:" and body["responses"][1] == "7"


def test_a_failing_server_is_retried_with_backoff_then_one_error():
    def flaky(body, hit):
        return (503, {"error": "warming up"}) if hit < 3 else (200, {"rewards": [2]})

    with Server(flaky) as srv:
        assert _client(srv.url).score(["p"], ["r"])[0].tolist() == [2.0]
        assert srv.hits == 3
    with Server(lambda body, hit: (500, b"boom")) as srv:
        start = time.monotonic()
        with pytest.raises(RewardError) as err:
            _client(srv.url, backoff_s=0.1).score(["p"], ["r"])
        assert srv.hits == 3 and time.monotonic() - start >= 0.3  # waited 0.1 + 0.2 s
    assert str(err.value) == (f"reward server {srv.url} failed 3 times (timeout 5s, 2 retries "
                              "with backoff); last: HTTP 500 (boom)")


def test_a_server_answering_badly_is_one_error_without_retries():
    cases = {"wrong length": ((200, {"rewards": [1.0]}), "returned 1 scores for 2 responses"),
             "no rewards": ((200, {"scores": [1, 2]}), 'answered without "rewards"'),
             "not json": ((200, b"<html>"), "answered with no JSON"),
             "nan": ((200, {"rewards": [1.0, float("nan")]}), "returned nan for row 1"),
             "client error": ((404, {"detail": "Not Found"}), "refused the request: HTTP 404")}
    for reply, message in cases.values():
        with Server(lambda body, hit, reply=reply: reply) as srv:
            with pytest.raises(RewardError) as err:
                _client(srv.url).score(["a", "b"], ["x", "y"])
            assert srv.hits == 1, message
        assert str(err.value).startswith(f"reward server {srv.url} ") and message in str(err.value)


def test_a_slow_or_absent_server_times_out():
    with Server(lambda body, hit: (200, {"rewards": [1]}), delay_s=1.0) as srv, \
            pytest.raises(RewardError, match=r"failed 2 times .*last: no answer within 0.2s"):
        _client(srv.url, timeout_s=0.2, retries=1).score(["p"], ["r"])
    with pytest.raises(RewardError, match="failed 2 times .*last: ConnectionRefusedError"):
        _client(srv.url, retries=1).score(["p"], ["r"])  # shut down: nothing listens


# --------------------------------------------------------------------------- rlhf ppo
DIGITS = tuple(str(i) for i in range(19))


def _arith_world(root: Path) -> dict[str, Path]:
    """A tiny policy whose words are digits (and the questions' words), and 3 arithmetic
    questions + 1 other prompt (every step's batch of 4: the other one is never scored)."""
    tok = ppo_tiny.tokenizer(("what", "is", "+", "-", "?", "the", "answer", *DIGITS))
    pol = ppo_tiny.policy(tok)
    pol.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    rows = arithmetic.make_prompts(3, seed=0, max_operand=4, ops="+")
    rows.append({"prompt_id": "other", "text": "tell me the answer"})
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"policy": root / "policy", "prompts": root / "prompts.jsonl"}


def _ppo(root: Path, world: dict, reward: str, *extra: str, **params):
    params = ppo_tiny.write_params(root / "params.yaml", **{
        "total_steps": 2, "checkpoint_every": 2, "csv_every": 1, "debug_rollouts": True,
        **params})
    from rlhf.cli.app import app

    store = root / "store"
    return CliRunner().invoke(app, [
        "ppo", "--policy", str(world["policy"]), "--reward", reward,
        "--prompts", str(world["prompts"]), "--out", str(root / "run"),
        "--rollouts", str(store / "rollouts"), "--rm-scores", str(store / "rm_scores"),
        "--params", str(params), "--run-id", "arith", *extra], env={"COLUMNS": "400"})


def _check_run(root: Path, version: str) -> None:
    """The rollouts' rewards are the rule's of the stored texts, the question-less prompt is
    unscored, rm_version names the reward, and StepCost counted each scored text."""
    from rlhf.store.io import read_table

    rows = read_table("rollouts", root / "store" / "rollouts").to_pylist()
    assert len(rows) == 2 * 4
    for r in rows:
        assert r["rm_version"] == version
        if r["prompt_id"] == "other":
            assert r["reward"] is None and r["scorer"] == "unscored"
            assert "unscored" in r["flags"]
        else:
            want = arithmetic.score([r["prompt_text"]], [r["response_text"]])[0][0]
            assert r["scorer"] == "light_rm" and r["reward"] == want
    scored = read_table("rm_scores", root / "store" / "rm_scores").to_pylist()
    assert len(scored) == 2 * 3 and {s["rm_version"] for s in scored} == {version}
    metrics = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        step = [r for r in rows if r["step"] == m["step"]]
        words = sum(len(f"{r['prompt_text']} {r['response_text']}".split()) for r in step)
        assert m["light_rm_calls"] == 4 and m["light_rm_tokens"] == words
        assert m["rollout_success_rate"] == 0.75  # the unscored row leaves the update


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_rlhf_ppo_trains_on_the_arithmetic_rule(tmp_path):
    world = _arith_world(tmp_path)
    res = _ppo(tmp_path, world, ARITH)
    assert res.exit_code == 0, res.output
    digest = hashlib.sha256(Path(arithmetic.__file__).read_bytes()).hexdigest()[:16]
    _check_run(tmp_path, f"{ARITH}@{digest}")


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_rlhf_ppo_scores_with_a_reward_server(tmp_path):
    world = _arith_world(tmp_path)
    with Server(arithmetic_server) as srv:
        res = _ppo(tmp_path, world, srv.url)
    assert res.exit_code == 0, res.output
    _check_run(tmp_path, srv.url)
    assert srv.hits == 2  # one batch a step


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_server_gets_the_texts_in_the_policys_chat_template(tmp_path):
    """OpenRLHF's contract: "query" is the whole text as the policy saw it (here a ChatML
    template), "prompts" the prompt as it read it, with the generation prompt."""
    from rlhf.pipeline.models.text import render_prompt, render_sample
    from test_chat_templates import CHATML, MULTI, SINGLE, _tokenizer

    tok = _tokenizer(CHATML)
    pol = ppo_tiny.policy(tok)
    pol.config.max_position_embeddings = 256
    pol.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    stored = [MULTI, SINGLE]
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(stored)))
    world = {"policy": tmp_path / "policy", "prompts": tmp_path / "prompts.jsonl"}
    with Server(lambda body, hit: (200, {"rewards": [1.0] * len(body["query"])})) as srv:
        res = _ppo(tmp_path, world, srv.url, total_steps=1, checkpoint_every=1, batch_size=2,
                   max_prompt_tokens=96, critic_max_tokens=128)
    assert res.exit_code == 0, res.output
    (body,) = srv.bodies
    by_prompt = {render_prompt(p, tok): p for p in stored}
    assert sorted(body["prompts"]) == sorted(by_prompt) and len(body["query"]) == 2
    for prompt, query, response in zip(body["prompts"], body["query"], body["responses"]):
        assert prompt.endswith("<|im_start|>assistant\n")
        assert query == render_sample(by_prompt[prompt], response, tok)
        assert query.startswith(prompt) and "Human:" not in query


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_rlhf_ppo_stops_with_one_line_on_a_bad_reward(tmp_path):
    world = _arith_world(tmp_path)
    short = _module(tmp_path, "def f(p, r):\n    return [0.0]\n")
    spec = f"python:{short}:f"
    res = _ppo(tmp_path, world, spec)
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert errors == [f"error: reward function {spec} returned 1 scores for 4 responses"]
    with Server(lambda body, hit: (200, {"rewards": [1.0]})) as srv:
        res = _ppo(tmp_path, world, srv.url)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert f"error: reward server {srv.url} returned 1 scores for 4 responses" in res.output
    # a feature that reads an RM's insides: refused before anything loads or is written
    res = _ppo(tmp_path / "esc", world, ARITH, escalate_below=0.5)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "error: --reward python:rlhf.pipeline.reward.rules.arithmetic:score: " \
           "ppo.escalate_below (escalation) needs" in res.output
    assert not (tmp_path / "esc" / "run").exists()
    # a spec whose file is missing: refused before the models load
    spec = f"python:{tmp_path / 'missing.py'}:f"
    res = _ppo(tmp_path / "typo", world, spec)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert f"error: --reward {spec}: no such file {tmp_path / 'missing.py'}" in res.output
    assert not (tmp_path / "typo" / "run").exists()
