"""Supervised planning cold start: Trajectory data -> packed batches -> sharded, checkpointed training.

`run_sft(config, workdir, data_path)` is the entry point (`mpa sft` calls it). Imports jax.
"""
from mpa_jax.sft.data import DataError, SFTData, load_sft_data  # noqa: F401
from mpa_jax.sft.loss import make_sft_loss  # noqa: F401
from mpa_jax.sft.trainer import SFTDiverged, SFTResult, run_sft, unigram_loss  # noqa: F401
