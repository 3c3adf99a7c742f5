"""The episode runner against the real sandbox env and tokenizer: token bookkeeping, feedback turns, limits, infra."""
from __future__ import annotations

import json

import numpy as np

import pytest

from mpa_jax import tokenizer as tk
from mpa_jax.envs import ErrorCode, Feedback, load_tasks, make_env
from mpa_jax.envs.base import EnvFault
from mpa_jax.envs.sandbox import SandboxEnv
from mpa_jax.eval import eval_metrics
from mpa_jax.envs.episode import PARSE_HINT
from mpa_jax.rollout.runner import EpisodeConfig, run_episodes
from mpa_jax.rollout.testing import ScriptedEngine
from mpa_jax.rollout.types import EngineError


@pytest.fixture(scope="module")
def tasks():
    dev = load_tasks("dev")
    return [t for t in dev if t.category == "tool_use" and not t.faults][:6]


def _gold_text(action: dict) -> str:
    if action["kind"] == "tool_call":
        return tk.format_tool_call(action["name"], action["arguments"])
    return action["text"]


def gold_script(tok, tasks):
    """Replays each task's gold actions, one per turn (the task is found by its instruction in the prompt)."""

    def script(prompt, _i):
        text = tok.decode(prompt)
        task = next(t for t in tasks if t.instruction in text)
        turn = text.count("<|im_start|>assistant") - 1
        return _gold_text(task.gold[min(turn, len(task.gold) - 1)])

    return script


def test_gold_replay_succeeds_with_exact_token_bookkeeping(tok, tasks):
    engine = ScriptedEngine(tok, gold_script(tok, tasks))
    cfg = EpisodeConfig.defaults(max_turns=8, max_new_tokens=256, batch_size=4, seed=1)
    trajs = run_episodes(engine, tok, tasks, lambda: make_env("sandbox"), cfg)
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    for task, traj in zip(tasks, trajs):
        assert traj.verification is not None and traj.verification.success, (task.id, traj.verification)
        assert traj.finish_reason == "answer" and not traj.infra_failure
        n_calls = sum(1 for g in task.gold if g["kind"] == "tool_call")
        assert [s.action.kind for s in traj.steps] == ["tool_call"] * n_calls + ["message"]
        assert all(s.feedback is not None and s.feedback.ok for s in traj.steps[:-1])
        assert traj.steps[-1].feedback is None  # the final message has no Feedback (contract: Step)
        assert traj.costs["tool_calls"] == n_calls and traj.costs["turns"] == n_calls + 1
        assert len(traj.tokens) == len(traj.loss_mask) == len(traj.logprobs)
        # Masked tokens are exactly the sampled ones, with their behaviour log-probs.
        assert all(lp == (-0.1 if m else 0.0) for m, lp in zip(traj.loss_mask, traj.logprobs))
        assert traj.provenance["domain"] == task.domain and traj.provenance["weight_version"] == "scripted"
    # Every prompt the engine saw is a prefix of its episode's final tokens (nothing re-tokenised).
    by_instruction = {t.instruction: tr for t, tr in zip(tasks, trajs)}
    for prompts, _, _ in engine.calls:
        for p in prompts:
            text = tok.decode(p)
            traj = next(tr for ins, tr in by_instruction.items() if ins in text)
            assert traj.tokens[: len(p)] == p and text.endswith("<|im_start|>assistant\n")
    # Decode steps of different episodes were batched together (4 live episodes per round at first).
    assert max(len(p) for p, _, _ in engine.calls) == 4
    m = eval_metrics(trajs)
    assert m["overall"]["success"] == 1.0 and m["overall"]["tasks"] == len(tasks) and m["by_category"]["Tool Use"]["success"] == 1.0


def test_token_stream_is_the_chat_rendering_of_what_was_sampled(tok, tasks):
    task = tasks[0]
    first = _gold_text(task.gold[0])
    engine = ScriptedEngine(tok, [first, "All done."])
    (traj,) = run_episodes(engine, tok, [task], lambda: make_env("sandbox"), EpisodeConfig.defaults(max_turns=4))
    obs = make_env("sandbox").reset(task)
    fb_msg = traj.messages[len(obs["messages"]) + 1]
    assert fb_msg["role"] == "tool"
    expected = (
        tk.render_chat(tok, obs["messages"], obs["tools"], add_generation_prompt=True)
        + first + "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + fb_msg["content"]
        + "\n</tool_response><|im_end|>\n<|im_start|>assistant\nAll done.<|im_end|>"
    )
    assert tok.decode(traj.tokens) == expected
    sampled = [t for t, m in zip(traj.tokens, traj.loss_mask) if m]
    assert sampled == tok.encode(first + "<|im_end|>") + tok.encode("All done.<|im_end|>")


def test_malformed_output_becomes_an_error_feedback_turn(tok, tasks):
    task = tasks[0]
    bad = '<tool_call>{"name": "create_contact", "arguments": {"name": </tool_call>'
    engine = ScriptedEngine(tok, [bad, "Sorry, I could not do it."])
    (traj,) = run_episodes(engine, tok, [task], lambda: make_env("sandbox"), EpisodeConfig.defaults(max_turns=4))
    assert traj.finish_reason == "answer" and not traj.infra_failure
    step = traj.steps[0]
    assert step.feedback.error_code == ErrorCode.INVALID_ARGUMENTS and "could not be parsed" in step.feedback.message
    assert step.action.raw.startswith("<tool_call>")
    tool_turn = json.loads(next(m for m in traj.messages if m["role"] == "tool")["content"])
    assert tool_turn["error"] == "INVALID_ARGUMENTS" and tool_turn["hint"] == PARSE_HINT
    assert "could not be parsed" in tok.decode(traj.tokens)  # shown to the model
    assert traj.costs["parse_errors"] == 1
    assert traj.verification is not None and not traj.verification.success


def test_limits_max_turns_max_tokens_and_cut_turns(tok, tasks):
    task = tasks[0]
    call = tk.format_tool_call("search_contacts", {"query": "a"})
    (traj,) = run_episodes(ScriptedEngine(tok, [call]), tok, [task], lambda: make_env("sandbox"), EpisodeConfig.defaults(max_turns=3))
    assert traj.finish_reason == "max_turns" and traj.costs["turns"] == 3
    assert traj.verification is not None and not traj.verification.infra_error

    # A turn cut by max_new_tokens (a runaway turn) is closed with an unsampled <|im_end|> (mask 0) and
    # answered with an error Feedback; it is not taken as the answer.
    long_text = "word " * 200
    cfg = EpisodeConfig.defaults(max_turns=2, max_new_tokens=8)
    (cut,) = run_episodes(ScriptedEngine(tok, [long_text]), tok, [task], lambda: make_env("sandbox"), cfg)
    im_end = tok.token_id("<|im_end|>")
    first_sampled = cut.loss_mask.index(1)
    assert cut.loss_mask[first_sampled : first_sampled + 9] == [1] * 8 + [0]
    assert cut.tokens[first_sampled + 8] == im_end
    assert cut.finish_reason == "max_turns" and cut.provenance["output_errors"] == {"cut_turn": 2}
    assert all(s.feedback.error_code == ErrorCode.INVALID_ARGUMENTS and "cut off" in s.feedback.message for s in cut.steps)
    assert cut.costs["malformed_turns"] == 2

    # max_output_errors: the episode ends after that many malformed turns, not at the turn limit
    cfg = EpisodeConfig.defaults(max_turns=8, max_new_tokens=8, max_output_errors=3)
    (quit_,) = run_episodes(ScriptedEngine(tok, [long_text]), tok, [task], lambda: make_env("sandbox"), cfg)
    assert quit_.finish_reason == "output_errors" and quit_.costs["turns"] == 3
    assert quit_.provenance["output_errors"] == {"cut_turn": 3} and not quit_.infra_failure

    prompt_len = cut.loss_mask.index(1)
    cfg = EpisodeConfig.defaults(max_turns=8, max_new_tokens=64, max_total_tokens=prompt_len + 40)
    (short,) = run_episodes(ScriptedEngine(tok, [call]), tok, [task], lambda: make_env("sandbox"), cfg)
    assert short.finish_reason == "max_tokens" and len(short.tokens) <= prompt_len + 40
    assert short.steps[0].feedback is not None  # the call ran; its feedback did not fit


class _FailingEnv(SandboxEnv):
    """A sandbox whose service times out on the first tool call (an INFRA/TIMEOUT world fault)."""

    def step(self, action):
        if action.kind == "tool_call":
            return Feedback.error(ErrorCode.TIMEOUT, "the device did not answer", call_id=action.call_id)
        return super().step(action)


class _CrashingEnv(SandboxEnv):
    """An env that reports a world fault by raising `EnvFault` (what a lost device does)."""

    def step(self, action):
        raise EnvFault("adb connection lost")


class _BuggyEnv(SandboxEnv):
    """An env with a programming error: not infra, the run must fail loudly with the episode named."""

    def step(self, action):
        return {}["missing"]


class _BuggyVerifyEnv(SandboxEnv):
    def verify(self):
        return {}["missing"]


class _BrokenEngine(ScriptedEngine):
    def generate(self, prompts, params, seeds=None):
        raise EngineError("server unreachable")


def test_infra_failures_are_marked_not_scored(tok, tasks):
    call = tk.format_tool_call("search_contacts", {"query": "a"})
    cfg = EpisodeConfig.defaults(max_turns=4)
    (timeout,) = run_episodes(ScriptedEngine(tok, [call]), tok, tasks[:1], _FailingEnv, cfg)
    (crash,) = run_episodes(ScriptedEngine(tok, [call]), tok, tasks[:1], _CrashingEnv, cfg)
    (engine_down,) = run_episodes(_BrokenEngine(tok, [call]), tok, tasks[:1], lambda: make_env("sandbox"), cfg)
    for traj in (timeout, crash, engine_down):
        assert traj.infra_failure and traj.finish_reason == "infra"
        assert traj.verification.infra_error and not traj.verification.success
        assert traj.provenance["infra_reason"]
    assert "TIMEOUT" in timeout.provenance["infra_reason"] and "adb" in crash.provenance["infra_reason"]
    m = eval_metrics([timeout, crash, engine_down])
    assert m["infra_failures"] == 3 and m["overall"]["tasks"] == 0


class _StreamingScripted(ScriptedEngine):
    """The scripted engine with `submit` (a `StreamingEngine`), so that the continuous schedule runs it."""

    vocab_limit = property(lambda self: self.tokenizer.vocab_size)
    max_positions = 1 << 20

    def submit(self, prompt_ids, params, seed=None, *, top_logprobs=0, on_update=None, updates=True):
        import concurrent.futures as cf

        fut: cf.Future = cf.Future()
        fut.set_result(self.generate([prompt_ids], params, [seed])[0])
        return fut


@pytest.mark.parametrize("engine_cls,env_cls", [(ScriptedEngine, _BuggyEnv), (_StreamingScripted, _BuggyEnv),
                                                (ScriptedEngine, _BuggyVerifyEnv)])
def test_a_bug_in_an_env_fails_the_run_with_the_episode_named(tok, tasks, engine_cls, env_cls):
    """Issue 55: a programming error is never infra (RL would drop it silently); it raises, with its traceback
    and a note naming the episode's task, on either schedule (rounds; continuous with a streaming engine)."""
    from mpa_jax.rollout.types import StreamingEngine

    call = tk.format_tool_call("search_contacts", {"query": "a"})
    engine = engine_cls(tok, [call])
    assert isinstance(engine, StreamingEngine) == (engine_cls is _StreamingScripted)
    with pytest.raises(KeyError, match="missing") as info:
        run_episodes(engine, tok, tasks[1:2], env_cls, EpisodeConfig.defaults(max_turns=1, schedule="continuous"))
    assert any(tasks[1].id in note for note in info.value.__notes__)
    assert info.traceback[-1].name in ("step", "verify")  # the traceback ends in the env's own code


def test_seeds_are_per_episode_and_turn(tok, tasks):
    engine = ScriptedEngine(tok, gold_script(tok, tasks))
    run_episodes(engine, tok, tasks[:3], lambda: make_env("sandbox"), EpisodeConfig.defaults(seed=5, batch_size=3))
    seeds = [s for _, _, ss in engine.calls for s in ss]
    assert len(set(seeds)) == len(seeds)
    engine2 = ScriptedEngine(tok, gold_script(tok, tasks))
    run_episodes(engine2, tok, tasks[:3], lambda: make_env("sandbox"), EpisodeConfig.defaults(seed=5, batch_size=3))
    assert seeds == [s for _, _, ss in engine2.calls for s in ss]
    params = engine.calls[0][1]
    assert params.stop_token_ids == (tok.token_id("<|im_end|>"),)  # the one token the template ends a turn with


class _IdsEngine(ScriptedEngine):
    """Replays fixed id lists as the model's turns (ids the text-scripted engine cannot express)."""

    def __init__(self, tok, turns, finish="stop"):
        super().__init__(tok, [""])
        self.turns, self.finish = turns, finish

    def generate(self, prompts, params, seeds=None):
        from mpa_jax.rollout.types import GenerateResult

        out = []
        for p in prompts:
            ids = list(self.turns[min(self._n, len(self.turns) - 1)])[: params.max_new_tokens]
            self._n += 1
            out.append(GenerateResult(ids, [-0.1] * len(ids), self.finish, prompt_tokens=len(p), weight_version="ids"))
        return out


def test_control_tokens_invalid_utf8_and_undecodable_ids_never_crash(tok, tasks):
    task = tasks[0]
    im_end, eot = tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")
    env = lambda: make_env("sandbox")  # noqa: E731
    cfg = EpisodeConfig.defaults(max_turns=2)
    # A sampled <|endoftext|> mid-turn: a control token in the wrong place. The stream keeps what was
    # sampled and the chat message holds the same raw text, so the template renders the same tokens.
    hi = tok.encode("Hi") + [eot] + tok.encode("there") + [im_end]
    done = tok.encode("All done.") + [im_end]
    (traj,) = run_episodes(_IdsEngine(tok, [hi, done]), tok, [task], env, cfg)
    assert traj.finish_reason == "answer" and traj.provenance["output_errors"] == {"control_token": 1}
    assert "<|endoftext|>" in traj.steps[0].feedback.message
    obs = make_env("sandbox").reset(task)
    assistant = traj.messages[len(obs["messages"])]
    assert assistant == {"role": "assistant", "content": "Hi<|endoftext|>there"}
    fb = traj.messages[len(obs["messages"]) + 1]["content"]
    expected = (tk.render_chat(tok, obs["messages"], obs["tools"], add_generation_prompt=True) + "Hi<|endoftext|>there<|im_end|>"
                "\n<|im_start|>user\n<tool_response>\n" + fb + "\n</tool_response><|im_end|>\n<|im_start|>assistant\nAll done.<|im_end|>")
    assert tok.decode(traj.tokens) == expected and tok.encode(expected) == traj.tokens
    # A spelled-out control string, a lone UTF-8 lead byte, an empty turn: error feedback each time.
    spelled = tok.encode("a <|im_start|>") if tok.encode("<|im_start|>") != [tok.token_id("<|im_start|>")] else \
        [i for ch in "<|im_start|>" for i in tok.encode(ch)]
    lone = tok.encode("é")[:1]
    assert tok.decode(lone) == "\ufffd"
    (traj,) = run_episodes(_IdsEngine(tok, [spelled + [im_end], lone + [im_end]]), tok, [task], env, cfg)
    assert traj.provenance["output_errors"] == {"control_token": 1, "invalid_utf8": 1} and traj.finish_reason == "max_turns"
    (traj,) = run_episodes(_IdsEngine(tok, [[]]), tok, [task], env, cfg)
    assert traj.provenance["output_errors"] == {"cut_turn": 2}
    # An id outside the tokenizer ends the episode as infra (never a reward), with the reason.
    (traj,) = run_episodes(_IdsEngine(tok, [[5, tok.vocab_size + 3]]), tok, [task], env, cfg)
    assert traj.finish_reason == "infra" and traj.infra_failure and str(tok.vocab_size + 3) in traj.provenance["infra_reason"]
    assert traj.provenance["output_errors"] == {"undecodable_token": 1}


def test_episodes_never_exceed_max_total_tokens(tok, tasks):
    """Cut turns reserve room for their closing <|im_end|>: every budget, even the tightest, holds."""
    task = tasks[0]
    prompt_len = len(tk.ChatSession(tok, make_env("sandbox").reset(task)["messages"], make_env("sandbox").reset(task)["tools"]).ids)
    for extra in (1, 2, 3, 9, 40, 77):
        cfg = EpisodeConfig.defaults(max_turns=6, max_new_tokens=16, max_total_tokens=prompt_len + extra)
        (traj,) = run_episodes(ScriptedEngine(tok, ["word " * 50]), tok, [task], lambda: make_env("sandbox"), cfg)
        assert len(traj.tokens) <= prompt_len + extra and traj.finish_reason == "max_tokens", (extra, len(traj.tokens))
        assert traj.tokens[-1] == tok.token_id("<|im_end|>") or len(traj.tokens) == prompt_len


class _NonFiniteEngine(ScriptedEngine):
    """A fault-injecting engine (a bf16 overflow, a diverged policy, a broken backend): the episodes whose
    prompt holds `bad` get a NaN or -inf behaviour log-prob; the others are sampled as usual."""

    def __init__(self, tok, script, bad: dict[str, float]):
        super().__init__(tok, script)
        self.bad = bad

    def generate(self, prompts, params, seeds=None):
        out = super().generate(prompts, params, seeds)
        for p, r in zip(prompts, out):
            text = self.tokenizer.decode(p)
            for needle, value in self.bad.items():
                if needle in text:
                    r.logprobs[len(r.logprobs) // 2] = value
        return out


def test_non_finite_logprobs_end_that_episode_as_infra_and_the_run_is_written(tok, tasks, tmp_path):
    """Before: one NaN log-prob crashed the whole round when the trajectories were written
    (`canonical_json`: 'Out of range float values are not JSON compliant')."""
    from mpa_jax.config import load_config_file
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.eval import Evaluator

    bad = {tasks[0].instruction: float("nan"), tasks[1].instruction: float("-inf")}
    engine = _NonFiniteEngine(tok, gold_script(tok, tasks), bad)
    config = load_config_file("configs/tiny.py")
    out = tmp_path / "run.jsonl"
    trajs = Evaluator(config, tasks, tokenizer=tok, progress=False).run(engine, str(out), greedy=True)
    assert [t.task_id for t in read_jsonl(str(out), Trajectory)] == [t.id for t in tasks]  # every episode kept, file valid
    for t in trajs[:2]:
        assert t.infra_failure and t.verification.infra_error and not t.verification.success
        assert "non-finite log-prob" in t.provenance["infra_reason"]
        assert all(np.isfinite(t.logprobs))  # nothing non-finite reached the token stream
    assert all(t.verification.success and not t.infra_failure for t in trajs[2:])
