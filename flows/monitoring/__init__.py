"""Monitoring without labels: the batches, thresholds, alert rules and MLflow records that
both the batch monitor flow (:mod:`flows.recalibration.label_free_monitor`) and the
served-traffic monitor (:mod:`flows.serving.traffic`) use, so neither reaches into the
other's room."""
