"""Orbax checkpoints of a training run: async, keep-N, atomic, exact resume, loud mismatches.

A checkpoint step directory holds three items, four with `extra`:
  state  the TrainState (params, optimizer state, step, rng), sharded arrays;
  data   the data iterator position as a global array (each process saves the rows it owns);
  meta   JSON: what the state was built for (model config, parameter shapes, data set, batch shape);
  extra  optional JSON: host-side run state that is not an array (RL: competence table, task cursor,
         weight version), saved atomically with the rest.
Orbax writes each step into a temporary directory and renames it when complete, so a run killed in
the middle of a save leaves the previous step as the latest complete one.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
    """A checkpoint cannot be used: missing, corrupt, or made for something else (the message says which)."""


def _flat_shapes(tree: Any) -> dict[str, list]:
    """{'params/a/b': [shape, dtype]} for every leaf: the fingerprint compared on restore."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out[jax.tree_util.keystr(path, simple=True, separator="/")] = [list(leaf.shape), str(leaf.dtype)]
    return out


def describe_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Human-readable differences between two nested JSON-like dicts (first differences first)."""
    diffs: list[str] = []
    for key in sorted(set(saved) | set(current)):
        name = f"{prefix}{key}"
        if key not in saved:
            diffs.append(f"{name} is missing from the checkpoint")
        elif key not in current:
            diffs.append(f"{name} is in the checkpoint but not in this run")
        elif isinstance(saved[key], Mapping) and isinstance(current[key], Mapping):
            diffs.extend(describe_mismatch(saved[key], current[key], name + "."))
        elif _norm(saved[key]) != _norm(current[key]):
            diffs.append(f"{name} is {saved[key]!r} in the checkpoint but {current[key]!r} in this run")
    return diffs


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


def find_step_dir(path: str) -> tuple[str, int]:
    """Resolve a run dir, a checkpoint dir or a step dir to (checkpoint root, step); latest when not given."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint path {path} does not exist")
    base = os.path.basename(path)
    if base.isdigit() and os.path.isdir(os.path.join(path, "state")):
        return os.path.dirname(path), int(base)
    root = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
    steps = sorted(int(d) for d in os.listdir(root) if d.isdigit() and os.path.isdir(os.path.join(root, d)))
    if not steps:
        raise CheckpointError(f"no complete checkpoint under {path}")
    return root, steps[-1]


class Checkpointer:
    """Saves every `every` steps (and when forced), keeps the last `keep`, restores exactly.

    `meta` describes what this run builds; a restore whose saved meta differs raises CheckpointError
    naming each difference (model shape, parameter shapes, data set, batch shape).
    """

    def __init__(self, directory: str, *, every: int, keep: int, async_save: bool = True, meta: Mapping[str, Any] | None = None):
        if every <= 0:
            raise ValueError(f"checkpoint.every must be positive, got {every}")
        self.directory = os.path.abspath(directory)
        self.every = int(every)
        self.meta = dict(meta or {})
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every,
            max_to_keep=keep if keep > 0 else None,
            enable_async_checkpointing=async_save,
            create=True,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data", "meta", "extra"))

    def latest_step(self) -> int | None:
        """The newest complete step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def due(self, step: int, *, force: bool = False) -> bool:
        """Whether `save(step)` would write (lets callers skip building what a save needs)."""
        return force or step % self.every == 0

    def save(self, step: int, state: Any, data_state: jax.Array, *, force: bool = False,
             extra: Mapping[str, Any] | None = None) -> bool:
        """Start saving (async) when `step` is due or `force`; returns whether a save started.

        `extra`: JSON-serialisable host state saved with the step (read back with `read_extra`).
        """
        if not self.due(step, force=force):
            return False
        meta = dict(self.meta, param_shapes=_flat_shapes(state.params), step=int(step))
        items = dict(
            state=ocp.args.StandardSave(state),
            data=ocp.args.StandardSave({"streams": data_state}),
            meta=ocp.args.JsonSave(meta),
        )
        if extra is not None:
            items["extra"] = ocp.args.JsonSave(dict(extra))
        return self._manager.save(
            step,
            args=ocp.args.Composite(**items),
            force=True,  # the due-check above is the policy (orbax's own would also save the first step)
        )

    def read_meta(self, step: int) -> dict[str, Any]:
        """The JSON meta of a saved step (raises CheckpointError when absent or unreadable)."""
        path = os.path.join(self.directory, str(step), "meta")
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {self.directory}/{step} has no meta item (incomplete or not ours)")
        drop_abandoned_read_reports()
        try:
            return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:  # orbax raises many types; the user needs one sentence
            raise CheckpointError(f"checkpoint {self.directory}/{step}: meta is unreadable ({_first_line(e)})") from None

    def read_extra(self, step: int) -> dict[str, Any]:
        """The `extra` JSON item of a saved step (CheckpointError when the step has none)."""
        path = os.path.join(self.directory, str(step), "extra")
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {self.directory}/{step} has no extra item (saved by another kind of run?)")
        drop_abandoned_read_reports()
        try:
            return self._manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore()))["extra"]
        except Exception as e:
            raise CheckpointError(f"checkpoint {self.directory}/{step}: extra is unreadable ({_first_line(e)})") from None

    def check_compatible(self, step: int, abstract_state: Any) -> None:
        """Raise CheckpointError listing every difference between the saved meta and this run's."""
        saved = self.read_meta(step)
        current = dict(self.meta, param_shapes=_flat_shapes(abstract_state.params))
        saved_cmp = {k: v for k, v in saved.items() if k != "step"}
        diffs = describe_mismatch(saved_cmp, current)
        if diffs:
            shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
            raise CheckpointError(f"checkpoint {self.directory}/{step} does not match this run: {shown}")

    def restore(self, step: int, abstract_state: Any, abstract_data: jax.ShapeDtypeStruct) -> tuple[Any, jax.Array]:
        """Restore (state, data_state) of `step` into the given shardings, after the compatibility check."""
        self.check_compatible(step, abstract_state)
        drop_abandoned_read_reports()
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=ocp.args.StandardRestore({"streams": abstract_data}),
                ),
            )
        except Exception as e:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step} is corrupt or incomplete and cannot be restored ({_first_line(e)})"
            ) from None
        state = out["state"]
        _check_finite_shapes(state, abstract_state, f"{self.directory}/{step}")
        return state, out["data"]["streams"]

    def wait(self) -> None:
        """Block until any async save has committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _check_finite_shapes(state: Any, abstract_state: Any, where: str) -> None:
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(abstract_state)):
        if tuple(got.shape) != tuple(want.shape):
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            raise CheckpointError(f"checkpoint {where}: {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")


def drop_abandoned_read_reports() -> None:
    """Keep a failed orbax restore to its one clear error (called before each restore; idempotent).

    Orbax reads a checkpoint's arrays as concurrent tensorstore reads on an asyncio loop; when one
    fails it closes the loop and raises, but tensorstore still completes the other reads, and each
    completion reports `RuntimeError('Event loop is closed')` from `call_soon_threadsafe` through
    sys.unraisablehook: dozens of tracebacks after our CheckpointError (41 for a corrupt tiny-model
    checkpoint). From the first call on, exactly those reports are dropped; any other unraisable
    exception still reaches the previous hook.
    """
    previous = sys.unraisablehook
    if getattr(previous, "drops_abandoned_reads", False):
        return

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if unraisable.object is None and isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        previous(unraisable)

    hook.drops_abandoned_reads = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def local_rows(array: jax.Array) -> dict[int, np.ndarray]:
    """{global row index: row} for the rows of a row-sharded global array this process holds."""
    out: dict[int, np.ndarray] = {}
    for shard in array.addressable_shards:
        rows = range(*shard.index[0].indices(array.shape[0]))
        data = np.asarray(shard.data)
        for i, r in enumerate(rows):
            out[r] = data[i]
    return out
