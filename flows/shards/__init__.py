"""Fitting and evaluating on shards held by Dask workers (too large for one process)."""
