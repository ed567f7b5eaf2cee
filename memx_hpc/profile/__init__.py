"""What is measured and kept: the minimal set (:mod:`~memx_hpc.profile.points`), the layer
campaign (:mod:`~memx_hpc.profile.campaign`, its job ledger :mod:`~memx_hpc.profile.ledger`,
through :mod:`memx_hpc.slurm.arrays`), the link campaign (:mod:`~memx_hpc.profile.link_campaign`,
its curves in :mod:`~memx_hpc.profile.comm`), the runner on the node, the HDF5 store, and the
importers and CSV interchange of published measurements."""
