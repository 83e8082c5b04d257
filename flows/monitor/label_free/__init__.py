"""Monitoring without labels, every piece in one room: the batches, estimates, alert rules
and MLflow records (:mod:`.records`, which the served-traffic monitor
:mod:`flows.serve.traffic` reads too), the Prefect flow (:mod:`.flow`), labels that arrive
later (:mod:`.labels`), the prior-shift candidate (:mod:`.candidate`) and the scheduled
monitor of new batches (:mod:`.schedule`)."""
