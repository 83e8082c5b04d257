"""The recalibration product: the Prefect flow, its monitor and schedule, and its plots."""
