"""Fitting and evaluating on shards held by Dask workers (too large for one process):
labelled outputs in Parquet shards (docs/ layout: score columns and ``labels``), one shard
a partition, out of core.

Order of events, so that bad input stops everything before a cluster is contacted:

1. :mod:`flows.shards.plan` lists the shards (a folder or glob,
   ``flows.files.expand_inputs``) and reads their footers (``describe_shards``): every
   shard must hold the same score layout and K, a ``labels`` column and rows;
   :mod:`flows.shards.fit` refuses a calibrator that cannot be fitted from partition sums,
   naming the ones that can (``cord_ops.names.REDUCIBLE``);
2. :mod:`flows.shards.session` connects to ``dask_address`` or starts a local cluster;
   each worker reads and validates its shards once (``data.load_parquet``: a bad value is
   reported naming the file, column and row), splits the rows (``reduce.split_rows``) and
   writes each part's scores to a raw ``.npy`` scratch file in its local directory
   (float32 when that is exact, never pickle); only labels and sample keys stay in worker
   memory (the tasks of :mod:`flows.shards.worker`);
3. every later pass reads the scratch files memory-mapped, in row blocks of about
   ``worker.BLOCK_BYTES`` of float64 (file pages are the page cache's, not the worker's
   heap), on the worker that wrote them: :mod:`flows.shards.fit` fits the calibrator from
   reduced sums, CORD's per-row scalars (kept in memory, 24 bytes a row) and eta* from
   exact partition sums (``cord_ops.reduce``), then the evaluation metrics. Closing the
   session deletes the scratch files.

The numerics live in ``cord_ops.reduce`` (pure numpy); this package only moves them.
"""
