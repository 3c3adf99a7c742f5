"""Evaluation on the sandbox benchmark: metrics over k runs per task, cost per 1,000 tasks, `eval.json`.

    from mpa_jax.eval import eval_metrics, evaluate
    m = eval_metrics(trajectories, k=4, prices=PriceTable(...))   # pure: no jax
    report = evaluate(config, "runs/x/hf", split="test", harness="off", k=1, out_dir="runs/x/eval")
"""
from mpa_jax.eval.metrics import CATEGORY_NAMES, PriceTable, eval_metrics, pass_at_k, pass_hat_k  # noqa: F401
from mpa_jax.eval.run import HarnessUnavailable, evaluate, harness_available, heldout_tasks, with_harness  # noqa: F401
