"""Cost models fitted on the store: the predictor (XGBoost, time and memory of a layer
query), the analytic roofline, link costs, and the composition of a plan from them
(:mod:`~memx_hpc.model.compose`, with the pipeline schedule of :mod:`~memx_hpc.model.schedule`);
calibration against end-to-end runs."""
