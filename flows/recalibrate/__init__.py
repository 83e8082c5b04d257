"""``cord-ops recalibrate``: the Prefect flow (:mod:`.flow`), its compute steps
(:mod:`.compute`), its store steps (:mod:`.store_steps`), the family selection, the run's
records, failure handling and plots."""
