"""Watching a champion at work: with labels (:mod:`flows.monitor.labelled`, which
recalibrates when calibration drifts) and without (:mod:`flows.monitor.label_free`: its
flow, records, arriving labels, candidate registration and schedule)."""
