"""Slurm, and nothing of what runs under it (slurm/ imports no profile/, model/ or search/).

:mod:`~memx_hpc.slurm.request` makes one :class:`SlurmRequest` per job component (the
``#SBATCH`` lines and submitit's parameters); :mod:`~memx_hpc.slurm.arrays` submits job
arrays through submitit and tells their states; :mod:`~memx_hpc.slurm.render` describes a
placed plan as a Megatron-LM sbatch script (pure; :mod:`~memx_hpc.slurm.cmdline` builds its
command lines, :mod:`~memx_hpc.slurm.groups` its cross-vendor process groups);
:mod:`~memx_hpc.slurm.submit` acts on a script (write, ``bash -n``, ``--test-only``, submit,
wait). Also: site discovery, start estimates, preflight checks, the local cluster.
"""
