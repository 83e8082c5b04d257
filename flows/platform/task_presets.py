"""The two Prefect task presets every flow of the project uses.

- :data:`compute_task`: pure computation. Results stay in memory: arrays are not hashed
  for a cache key (``NO_CACHE``) and nothing is pickled to result storage.
- :data:`store_task`: talks to the tracking store. Same result handling, plus up to three
  retries, but only for a passing store outage
  (:func:`flows.store.retries.transient_store_error`), so a bad argument or a missing model
  fails at once.

Apply them as decorators (``@compute_task``) or derive from them
(``compute_task.with_options(timeout_seconds=...)``).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.store.retries import transient_store_error

STORE_RETRY_DELAYS = (0.5, 1.0, 2.0)

compute_task = task(cache_policy=NO_CACHE, persist_result=False)
store_task = task(cache_policy=NO_CACHE, persist_result=False, retries=len(STORE_RETRY_DELAYS),
                  retry_delay_seconds=list(STORE_RETRY_DELAYS),
                  retry_condition_fn=transient_store_error)
