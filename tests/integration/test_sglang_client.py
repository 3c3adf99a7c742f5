"""The SGLang 0.5.x client driven against `mpa serve` over real loopback HTTP (and a flaky server for retries):
one server, and a worker list the client balances itself (the router case is tests/integration/test_fleet_router.py)."""
from __future__ import annotations

import os
import threading

import httpx

import numpy as np

import pytest

import jax  # noqa: F401
import fastapi  # noqa: F401  (the serve extra; a missing install must fail, not skip)

from mpa_jax import tokenizer as tk  # noqa: E402
from mpa_jax.rollout.jax_engine import Engine  # noqa: E402
from mpa_jax.rollout.server import ServerThread, create_app  # noqa: E402
from mpa_jax.rollout.sglang import SGLangEngine, parse_generate_item, sampling_payload  # noqa: E402
from mpa_jax.rollout.testing import tiny_checkpoint  # noqa: E402
from mpa_jax.rollout.types import EngineError, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang")
    tok = tk.build_tokenizer(tk.synthetic_corpus(200), 1024, None)
    ckpt = tiny_checkpoint(str(root / "a"), vocab_size=tok.vocab_size, seed=0)
    other = tiny_checkpoint(str(root / "b"), vocab_size=tok.vocab_size, seed=3)
    engine = Engine.from_pretrained(ckpt, max_batch=4, weight_version="a")
    server = ServerThread(create_app(engine, tok, model_path=ckpt, max_batch=4)).start()
    yield {"tok": tok, "ckpt": ckpt, "other": other, "engine": engine, "server": server, "root": root}
    server.stop()


def _prompts(tok):
    return [tok.encode(t) for t in ("set an alarm for seven", "call mom", "what is the weather in Paris tomorrow?")]


def test_generate_over_http_equals_the_engine(setup):
    tok, ref = setup["tok"], setup["engine"]  # the server's own engine, called directly while the server is idle
    client = SGLangEngine(setup["server"].url, max_concurrency=2)
    prompts = _prompts(tok)
    for sp in (SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=tuple(tok.eos_token_ids)),
               SamplingParams.for_ratios(max_new_tokens=12, temperature=0.9, top_p=0.5)):
        got = client.generate(prompts, sp, seeds=[1, 2, 3])
        want = ref.generate(prompts, sp, seeds=[1, 2, 3])
        for g, w in zip(got, want):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            # One request per prompt, two in flight: the server batches them differently from the direct
            # call, and other batch shapes reorder float32 reductions, so log-probs agree to ~1e-6, not bit for bit.
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
            assert g.weight_version == "a" and g.prompt_tokens == len(prompts[got.index(g)])
    assert client.device_s > 0


def test_health_model_info_and_weight_sync(setup):
    tok = setup["tok"]
    client = SGLangEngine(setup["server"].url)
    assert client.health()
    assert client.model_info()["weight_version"] == "a"
    prompts = _prompts(tok)
    sp = SamplingParams(max_new_tokens=10, temperature=0.0)
    before = client.generate(prompts, sp)
    expected = Engine.from_pretrained(setup["other"], max_batch=4).generate(prompts, sp)
    client.update_weights(setup["other"], "b")  # /update_weights_from_disk, then /flush_cache
    after = client.generate(prompts, sp)
    assert client.weight_version == "b" and {r.weight_version for r in after} == {"b"}
    assert [r.token_ids for r in after] == [r.token_ids for r in expected] != [r.token_ids for r in before]
    assert client.model_info()["model_path"] == setup["other"]
    # From a params pytree: the client exports an HF checkpoint and has the server load it.
    from mpa_jax import models
    from mpa_jax.export_sync import hf_exporter

    original = models.from_pretrained(setup["ckpt"])
    client.exporter = hf_exporter(original.cfg, dtype="float32")
    client.export_root = str(setup["root"] / "exports")
    client.update_weights(original.params, "a")
    assert os.path.isfile(os.path.join(client.export_root, "weights-a", "config.json"))
    assert [r.token_ids for r in client.generate(prompts, sp)] == [r.token_ids for r in before]
    with pytest.raises(EngineError, match="model_path"):
        client.update_weights("/nonexistent/dir", "x")
    assert client.weight_version == "a"


def test_unhealthy_server_and_payload_details():
    dead = SGLangEngine("http://127.0.0.1:9", max_retries=1, backoff_s=0.01, timeout_s=2)
    assert not dead.health()
    with pytest.raises(EngineError, match="failed after 2 attempts"):
        dead.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    p = sampling_payload(SamplingParams.for_ratios(max_new_tokens=7, temperature=0.8, top_k=5, top_p=0.3, stop_token_ids=(4,)), seed=9)
    assert p["max_new_tokens"] == 7 and p["stop_token_ids"] == [4] and p["top_p"] == 1.0 and p["top_k"] == -1
    assert p["sampling_seed"] == 9 and p["skip_special_tokens"] is False
    with pytest.raises(EngineError, match="output_token_logprobs"):
        parse_generate_item({"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}})
    with pytest.raises(EngineError, match="disagree"):
        parse_generate_item({"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "length"},
                                                                  "output_token_logprobs": [[-0.5, 1, None]]}})
    r = parse_generate_item({"output_ids": [5, 2], "meta_info": {"finish_reason": {"type": "stop", "matched": 2},
                                                              "output_token_logprobs": [[-0.5, 5, None], [-0.1, 2, None]],
                                                              "prompt_tokens": 3, "weight_version": "w7"}})
    assert (r.token_ids, r.logprobs, r.finish_reason, r.matched_stop, r.weight_version) == ([5, 2], [-0.5, -0.1], "stop", 2, "w7")


def test_retries_5xx_and_waits_for_flush():
    """A real HTTP server that fails the first requests: the client retries with backoff."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    counts = {"generate": 0, "flush": 0, "update": 0}
    lock = threading.Lock()

    @app.post("/generate")
    async def generate(body: dict):
        with lock:
            counts["generate"] += 1
            n = counts["generate"]
        if body["input_ids"] == [4, 0, 4]:  # a request the server rejects: 4xx, never retried
            return JSONResponse({"error": {"message": "input_ids: required"}}, status_code=400)
        if n <= 2:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        # The shape sglang-router accepts: one prompt, one sampling_params object.
        assert isinstance(body["sampling_params"], dict) and all(isinstance(t, int) for t in body["input_ids"])
        return {"text": "", "output_ids": [7, 3], "meta_info": {"finish_reason": {"type": "stop", "matched": 3},
                "output_token_logprobs": [[-1.0, 7, None], [-0.2, 3, None]], "prompt_tokens": len(body["input_ids"])}}

    @app.post("/update_weights_from_disk")
    async def update(body: dict):
        counts["update"] += 1
        return {"success": True, "message": "ok", "num_paused_requests": 0}

    @app.post("/flush_cache")
    async def flush():
        counts["flush"] += 1
        if counts["flush"] < 3:
            return JSONResponse({"error": {"message": "Cache not flushed: pending requests"}}, status_code=400)
        return {"success": True}

    with ServerThread(app) as server:
        client = SGLangEngine(server.url, max_retries=3, backoff_s=0.01)
        (r,) = client.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
        assert r.token_ids == [7, 3] and counts["generate"] == 3
        client.update_weights("/tmp", "v9")  # the server is told the path; flush is retried while it answers 400
        assert counts["update"] == 1 and counts["flush"] == 3 and client.weight_version == "v9"
        with pytest.raises(EngineError, match="HTTP 400: input_ids: required"):
            client.generate([[4, 0, 4]], SamplingParams(max_new_tokens=4))
        assert counts["generate"] == 4  # 4xx: asked once, no retry


def test_agent_loop_over_http_equals_in_process(setup):
    """Rollouts through the SGLang client against `mpa serve` are the in-process rollouts, token for token."""
    from mpa_jax.envs import load_tasks, make_env
    from mpa_jax.rollout.runner import EpisodeConfig, run_episodes

    tok = setup["tok"]
    tasks = load_tasks("dev")[:2]
    cfg = EpisodeConfig.defaults(max_turns=2, max_new_tokens=8, temperature=1.0, seed=4, batch_size=2)
    client = SGLangEngine(setup["server"].url)
    client.update_weights(setup["ckpt"], "a")  # whatever an earlier test left loaded
    over_http = run_episodes(client, tok, tasks, lambda: make_env("sandbox"), cfg)
    in_process = run_episodes(setup["engine"], tok, tasks, lambda: make_env("sandbox"), cfg)
    for a, b in zip(over_http, in_process):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask and a.finish_reason == b.finish_reason
        # One request per episode: the server may admit the two into different decode chunks than the
        # in-process batch, and other batch shapes reorder float32 reductions (~1e-6).
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert a.provenance["engine"] == "SGLangEngine" and a.provenance["weight_version"] == "a"


def test_ids_outside_the_tokenizer_are_an_engine_error_not_a_crash():
    """A real loopback server (a fake of an SGLang server, which cannot run here) that answers with a
    padded-embedding id or malformed entries: the client raises EngineError naming the problem."""
    from fastapi import FastAPI

    app = FastAPI()
    answers = {
        "pad": {"output_ids": [5, 3924], "meta_info": {"finish_reason": {"type": "length"},
                "output_token_logprobs": [[-0.5, 5, None], [-2.0, 3924, None]]}},
        "neg": {"output_ids": [-1], "meta_info": {"finish_reason": {"type": "length"},
                "output_token_logprobs": [[-0.5, -1, None]]}},
        "junk": {"output_ids": [5], "meta_info": {"finish_reason": {"type": "length"},
                 "output_token_logprobs": [["x", 5]]}},
        "short": {"meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5]]}},
    }
    which = {"kind": "pad"}

    @app.post("/generate")
    async def generate(body: dict):
        return answers[which["kind"]]

    with ServerThread(app) as server:
        client = SGLangEngine(server.url, max_retries=0, vocab_limit=3632)
        for kind, match in (("pad", "token id 3924, outside the tokenizer's vocabulary \\[0, 3632\\)"),
                            ("neg", "token id -1"), ("junk", "non-numeric logprob"), ("short", "not \\[logprob, token_id")):
            which["kind"] = kind
            with pytest.raises(EngineError, match=match):
                client.generate([[1, 2]], SamplingParams(max_new_tokens=2))
        which["kind"] = "pad"
        (r,) = SGLangEngine(server.url, max_retries=0).generate([[1]], SamplingParams(max_new_tokens=2))
        assert r.token_ids == [5, 3924]  # without a limit the client cannot know; the agent loop then ends the episode
    with pytest.raises(ValueError, match="vocab_limit"):
        SGLangEngine("http://127.0.0.1:9", vocab_limit=0)


@pytest.fixture(scope="module")
def pair(setup):
    """A second `mpa serve` on the first one's weights: a worker list of two real servers."""
    engine = Engine.from_pretrained(setup["ckpt"], max_batch=4, weight_version="a")
    second = ServerThread(create_app(engine, setup["tok"], model_path=setup["ckpt"], max_batch=4)).start()
    yield [setup["server"], second]
    second.stop()


def _rows_served(server) -> int:
    return server.server.config.app.state.get_batcher().rows


def _load(url, ckpt, version):
    r = httpx.post(url + "/update_weights_from_disk", json={"model_path": ckpt, "weight_version": version}, timeout=60)
    assert r.status_code == 200 and r.json()["success"], r.text


def test_worker_list_spreads_a_batch_and_syncs_every_worker(setup, pair):
    """Without a router the client balances: one request per prompt, each to the least busy live worker;
    `update_weights` loads and flushes on every worker; results are in prompt order."""
    tok = setup["tok"]
    for s in pair:
        _load(s.url, setup["ckpt"], "a")  # whatever an earlier test left loaded
    client = SGLangEngine(workers=[s.url for s in pair], max_concurrency=4)
    assert client.mode == "fleet"
    prompts = _prompts(tok) * 2
    sp = SamplingParams.for_ratios(max_new_tokens=8, temperature=1.0)
    before = [_rows_served(s) for s in pair]
    got = client.generate(prompts, sp, seeds=list(range(6)))
    want = setup["engine"].generate(prompts, sp, seeds=list(range(6)))
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    served = [_rows_served(s) - b for s, b in zip(pair, before)]
    assert sum(served) == 6 and min(served) >= 1, served  # both workers took part of the batch
    assert sorted(w.requests for w in client.workers()) == sorted(served)

    client.update_weights(setup["other"], "b")
    assert {httpx.get(s.url + "/model_info").json()["weight_version"] for s in pair} == {"b"}
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    expected = Engine.from_pretrained(setup["other"], max_batch=4).generate(prompts, greedy)
    after = client.generate(prompts, greedy)
    assert [r.token_ids for r in after] == [r.token_ids for r in expected] and {r.weight_version for r in after} == {"b"}
    client.update_weights(setup["ckpt"], "a")


def test_a_worker_that_cannot_load_is_taken_out_and_versions_never_mix(setup, pair):
    """A dead worker fails the sync: out of rotation with a message naming it; a worker switched to other
    weights behind the client's back: its rows come back as aborts (never as results of the wrong
    weights), it is taken out, and the rest of the fleet goes on."""
    tok = setup["tok"]
    dead = "http://127.0.0.1:9"
    client = SGLangEngine(workers=[pair[0].url, pair[1].url, dead], max_concurrency=6, max_retries=1, backoff_s=0.01,
                          timeout_s=60)
    client.update_weights(setup["ckpt"], "a")
    assert client.live_workers() == [pair[0].url, pair[1].url]
    (event,) = client.events
    assert dead in event and "failed to load weights a" in event and "2 of 3 workers left" in event

    _load(pair[1].url, setup["other"], "rogue")  # a worker now serves other weights than the engine's
    sp = SamplingParams(max_new_tokens=4, temperature=0.0)
    out = client.generate(_prompts(tok) * 2, sp)
    aborted = [r for r in out if r.finish_reason == "abort"]
    assert aborted and all("'rogue'" in r.error and "missed the weight sync" in r.error for r in aborted)
    assert all(r.weight_version == "a" for r in out if r.finish_reason != "abort")
    assert client.live_workers() == [pair[0].url] and client.failed_rows == len(aborted)
    assert any(pair[1].url in e and "serves weights 'rogue'" in e for e in client.events)
    again = client.generate(_prompts(tok) * 2, sp)
    assert all(r.finish_reason != "abort" and r.weight_version == "a" for r in again)
    # The next sync gives every worker another chance: the rogue one loads and is back in rotation.
    client.update_weights(setup["ckpt"], "a")
    assert client.live_workers() == [pair[0].url, pair[1].url]
    with pytest.raises(EngineError, match="no SGLang worker loaded"):
        client.update_weights("/nonexistent/dir", "x")
    assert client.weight_version == "a" and client.live_workers() == [pair[0].url, pair[1].url]


def test_engine_from_config_reads_the_rollout_keys():
    from mpa_jax.config import load_config_file
    from mpa_jax.rollout.sglang import engine_from_config

    c = load_config_file("configs/tiny.py")
    c.rollout.sglang_url, c.rollout.sglang_workers = "", ("http://127.0.0.1:1", "http://127.0.0.1:2")
    c.rollout.batch_size, c.rollout.sglang_max_retries, c.rollout.sglang_max_staleness = 5, 0, 1
    e = engine_from_config(c, vocab_limit=100)
    assert (e.mode, e.max_concurrency, e.max_retries, e.max_staleness, e.vocab_limit) == ("fleet", 5, 0, 1, 100)
    import ml_collections

    d = load_config_file("configs/tiny.py").to_dict()  # every other key from configs/, the one source of defaults
    d["rollout"].update(sglang_url="", sglang_workers="http://127.0.0.1:1, http://127.0.0.1:2")  # a string list too
    as_text = ml_collections.ConfigDict(d)
    assert [w.url for w in engine_from_config(as_text).workers()] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    c.rollout.sglang_workers = ()
    with pytest.raises(ValueError, match="sglang_url .* or config.rollout.sglang_workers must be set"):
        engine_from_config(c)
    c.rollout.sglang_workers = ("127.0.0.1:1",)
    with pytest.raises(ValueError, match="must start with http"):
        engine_from_config(c)
    c.rollout.sglang_url, c.rollout.sglang_workers, c.rollout.sglang_max_retries = "http://127.0.0.1:3", (), -1
    with pytest.raises(ValueError, match="sglang_max_retries must be an int >= 0"):
        engine_from_config(c)
    from mpa_jax.rollout.sglang import version_accepted

    assert version_accepted("3", "3") and version_accepted("x", "") and not version_accepted("2", "3")
    assert version_accepted("2", "3", 1) and not version_accepted("1", "3", 1) and not version_accepted("4", "3", 1)


def test_a_base_url_that_is_not_a_router_with_workers_is_refused(setup):
    client = SGLangEngine(setup["server"].url, workers=[setup["server"].url])
    with pytest.raises(EngineError, match="is not a router .* must be an sglang-router or empty"):
        client.update_weights(setup["ckpt"], "a")


def test_launch_commands_for_a_fleet(tmp_path):
    """The SGLang worker line with deterministic inference (seeds honoured) and the router line."""
    import json

    from mpa_jax.rollout.launch import router_launch_command, sglang_launch_command

    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert "--enable-deterministic-inference" in sglang_launch_command(str(ckpt), deterministic=True)
    assert "--enable-deterministic-inference" not in sglang_launch_command(str(ckpt))
    cmd = router_launch_command(["http://w1:31001", "http://w2:31001"], port=30000, policy="round_robin")
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    assert cmd[cmd.index("--worker-urls") + 1:cmd.index("--host")] == ["http://w1:31001", "http://w2:31001"]
    assert cmd[cmd.index("--policy") + 1] == "round_robin"
    with pytest.raises(ValueError, match="policy must be one of"):
        router_launch_command(["http://w1:1"], policy="fastest")
    with pytest.raises(ValueError, match="must start with http"):
        router_launch_command(["w1:1"])
