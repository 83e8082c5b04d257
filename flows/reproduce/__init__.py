"""The paper's reproduction: ``cord-ops reproduce`` (the evaluation protocol as a Prefect
flow on Dask, with the paper's tables and figures) and ``cord-ops bench`` (the timing table).

A product of its own beside the recalibration product: nothing outside this package imports
it except the command line, which offers its two commands. Imports run one way, top to
bottom:

- :mod:`~flows.reproduce.cli`: the two command lines and their handlers;
- :mod:`~flows.reproduce.flow` and :mod:`~flows.reproduce.bench`: the sweep flow and its
  MLflow records, the timing table;
- :mod:`~flows.reproduce.cell` and :mod:`~flows.reproduce.report`: one (file, calibrator,
  seed) evaluation, the tables and figures;
- :mod:`~flows.reproduce.stats` and :mod:`~flows.reproduce.paper`: paired statistics, the
  paper's published numbers;
- :mod:`~flows.reproduce.plan` and :mod:`~flows.reproduce.defaults`: what a sweep covers;
- :mod:`~flows.reproduce.timing`: the one timing protocol, which the scripts in
  ``benchmarks/`` use too.

Its own dependency, prefect-dask (Prefect's task runner on Dask), comes with the
``reproduce`` extra: ``pip install -e ".[reproduce]"``.
"""
