"""memx-hpc: memory-aware automatic parallelism for Megatron-LM on cross-vendor Slurm clusters."""

__version__ = "0.1.0"
