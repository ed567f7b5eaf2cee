"""Training on this machine: a megatron-core GPT trainer that takes Megatron-LM's command line.

``python -m memx_hpc.train.pretrain_gpt`` is the local site's Megatron entry point (real
sites name Megatron-LM's ``pretrain_gpt.py``); :mod:`memx_hpc.train.logs` reads the
iteration time and memory back from either one's log. Nothing here imports torch at
import time.
"""
