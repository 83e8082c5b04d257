"""Run by Python at start-up when this folder is on PYTHONPATH: every process the
registry-integrity tests start gets the test fault hook (see ``cord_faults.py``), which
acts only when a ``CORD_OPS_TEST_*`` variable names a step."""

import cord_faults

cord_faults.install()
