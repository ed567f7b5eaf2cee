"""The search: the space of runnable plans (:mod:`~memx_hpc.search.space`, streamed as blocks
the composition prices), the objective and the picks, the prediction cache, the serial or
MPI engine, and the report (tables, plan files, the Pareto plot)."""
