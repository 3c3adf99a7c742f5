"""Evaluation on the sandbox benchmark: one task selection, one metrics definition, one evaluator.

    from mpa_jax.eval import Evaluator, eval_metrics, evaluate, select_tasks
    tasks = select_tasks("dev", n_seen=32, n_held_out=16)           # stratified; seen / held-out templates (tuning)
    tasks = evaluation_tasks("preregistered", n_seen=32, n_held_out=16)  # the pre-registered test set's 48 (headlines)
    m = eval_metrics(trajectories, k=4, prices=PriceTable(...), ks=(1, 4))  # pure: no jax; pass@k + pass^k
    report = evaluate(config, "runs/x/hf", split="test", harness="off", k=1, out_dir="runs/x/eval")
    on_eval = success_eval(config, tasks, tok, out_dir)               # the SFT trainer's success hook
"""
from mpa_jax.eval.metrics import (  # noqa: F401
    CATEGORY_NAMES, PriceTable, eval_metrics, pass_at_k, pass_at_k_metrics, pass_hat_k, passk_view, success_view,
)
from mpa_jax.eval.tasks import (  # noqa: F401
    PREREGISTERED, PreregisteredError, evaluation_tasks, held_out_templates, select_tasks, stratified, template_group,
)
from mpa_jax.eval.evaluator import HARNESS_MODES, ORACLE, Evaluator, evaluate, format_eval, harness_modes  # noqa: F401
from mpa_jax.eval.success import format_passk, pass_ks, passk_report, success_eval  # noqa: F401
