"""Mutation score of the modules that carry the product's promises.

    pip install -e ".[test,mutation]"
    python benchmarks/mutation.py [--modules cord_ops/cord.py flows/store/owner.py ...]
                                  [--max-children 2] [--survivors] [--keep]

For each module of :data:`MODULES` it runs mutmut (configured in ``pyproject.toml``,
``[tool.mutmut]``) in a scratch copy of the repository with ``only_mutate`` = that module
and the test selection = that module's own fast tests (the list beside it), then prints
per module: mutants, killed, survived (not accepted), accepted equivalent, untested
("no tests": mutants in code no selected test runs, e.g. functions only end-to-end runs
reach; counted as not killed), timeouts (counted as killed, as mutmut does) and

    score = killed / (mutants - accepted equivalent)

plus the wall time and the machine's load (``os.getloadavg``) before and after: on a
shared machine the times say as much about the neighbours as about the tests.

Survivors are matched against :data:`ACCEPTED`, keyed ``module::function::old -> new``
(the function as mutmut names it, ``Class.method`` for methods, and the changed source
line before and after, whitespace-collapsed), not by mutmut's numeric ids, which change
whenever a function above gains a mutant. ``--survivors`` prints each unaccepted
survivor's key and diff.

mutmut's limits (3.x): functions with decorators other than ``@staticmethod`` /
``@classmethod`` are not mutated (Prefect tasks and flows, context managers), nor is code
at module level (constants); those are outside the score. The scratch copy means nothing
is written into the repository; running ``mutmut run`` by hand in the repository root
leaves ``mutants/`` there (git-ignored, outside ruff and pytest discovery).

Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cord_ops", "onnx_export", "flows")
TIMEOUT_MULTIPLIER, TIMEOUT_CONSTANT = 3.0, 10.0

#: The selection of both halves of the champion gate (flows/promotion/rules.py and
#: champion.py), kept as it was when they were one module, gate.py.
_GATE_TESTS = ["tests/flows/promotion/test_rules.py",
               "tests/flows/promotion/test_gate_units.py",
               "tests/flows/promotion/test_champion_history.py",
               "tests/flows/promotion/test_champion.py",
               # its TS cases (ms per fit), not the hypothesis test over 5 families
               "tests/flows/recalibrate/test_parity_tolerance.py::test_tolerance_grows_with_the_values_and_still_catches_a_wrong_graph",  # noqa: E501
               "tests/flows/recalibrate/test_parity_tolerance.py::test_tolerance_is_never_below_the_fixed_floor"]  # noqa: E501

#: The fast tests of CORD's three modules (estimator, kernels, solver): cord.py was one
#: module when these were written, and test_reduce.py reaches the estimator's fit helpers.
_CORD_TESTS = ["tests/core/test_cord_pieces.py", "tests/core/test_cord.py",
               "tests/core/test_cord_blocks.py", "tests/core/test_cord_bisection.py",
               "tests/core/test_reduce.py", "tests/core/test_threshold.py"]

#: module -> its own fast tests (files or node ids; ``-m "not slow"`` is added).
MODULES: dict[str, list[str]] = {
    # mutmut runs a mutant's tests fastest first and stops at the first failure (-x), so
    # test_cord_pieces.py's unit tests decide most kills before the hypothesis properties
    "cord_ops/cord.py": _CORD_TESTS,
    "cord_ops/cord_kernels.py": _CORD_TESTS,
    "cord_ops/cord_solve.py": _CORD_TESTS,
    # test_reduce_drivers.py's unit tests first: they decide most kills in seconds
    "cord_ops/reduce.py": ["tests/core/test_reduce_drivers.py", "tests/core/test_reduce.py",
                           "tests/core/test_cord_bisection.py"],
    "cord_ops/partition_sums.py": ["tests/core/test_partition_sums.py",
                                   "tests/core/test_reduce.py",
                                   "tests/core/test_cord_bisection.py",
                                   "tests/calibrators/test_temperature_fit.py"],
    "cord_ops/metrics.py": ["tests/core/test_metrics.py", "tests/core/test_cord_bisection.py",
                            "tests/calibrators/test_temperature_fit.py",
                            # the repair's effect and the metrics at a threshold
                            "tests/core/test_binary_production.py",
                            "tests/core/test_threshold.py"],
    "cord_ops/calibrators/temperature.py": [
        "tests/calibrators/test_closed_forms.py", "tests/core/test_cord_bisection.py",
        "tests/calibrators/test_temperature_fit.py",
        "tests/calibrators/test_bounded_refit.py",
        # it checks the warning's stack level, which mutmut's trampoline frame shifts
        "--deselect=tests/calibrators/test_temperature_fit.py::test_the_bound_warning_points_at_the_caller_of_fit"],  # noqa: E501
    "cord_ops/validation.py": ["tests/calibrators/test_bad_input.py",
                               "tests/core/test_cord_bisection.py",
                               "tests/calibrators/test_temperature_fit.py",
                               "tests/core/test_validation.py"],
    "onnx_export/repair.py": ["tests/onnx/test_repair_graph.py", "tests/onnx/test_fixup.py"],
    "flows/promotion/rules.py": _GATE_TESTS,
    # the guards of every hand move of @champion pure functions of tags
    "flows/promotion/guards.py": ["tests/flows/promotion/test_guards.py"],
    "flows/promotion/champion.py": _GATE_TESTS,
    # test_registry.py without its retry test, whose Prefect setup is slow for every process
    "flows/store/lock.py": [
        "tests/flows/store/test_registry.py::test_file_lock_serialises_processes_names_the_holder_and_survives_a_kill_9",  # noqa: E501
        "tests/flows/store/test_registry.py::test_lease_lock_serialises_processes_and_a_dead_local_holder_is_taken_over",  # noqa: E501
        "tests/flows/store/test_registry.py::test_a_foreign_or_unreadable_store_file_gives_one_error_line",  # noqa: E501
        "tests/flows/store/test_lock.py"],
    "flows/store/registry.py": [
        "tests/flows/store/test_registry_unit.py", "tests/flows/store/test_owner.py",
        "tests/flows/store/test_registry.py::test_only_a_locked_sqlite_database_is_retried",
        "tests/flows/store/test_registry.py::test_clean_up_undoes_dead_owners_only",
        "tests/flows/store/test_registry.py::test_register_version_is_idempotent_per_run",
        "tests/flows/store/test_registry.py::test_withdraw_restores_the_alias_and_deletes_the_version"],
    "cord_ops/label_free.py": ["tests/core/test_label_free.py"],
    # choosing the calibrator family by cross-validation; test_select_units.py
    # (stand-in calibrators, ~0.5 s) and test_select.py's tests that fit little (its
    # realistic selections take 1-3 s each per mutant)
    "cord_ops/select.py": ["tests/calibrators/test_select_units.py"] + [
        f"tests/calibrators/test_select.py::{name}" for name in (
            "test_near_ties_go_to_the_simplest_family_within_tie_se_paired_errors",
            "test_identity_may_have_its_own_near_tie_width",
            "test_the_record_and_the_table_hold_every_figure_as_given",
            "test_a_family_past_the_budget_is_named_and_left_out")],
    # decisions at a binary threshold (the derivation lives in the module)
    "cord_ops/threshold.py": ["tests/core/test_threshold.py"],
    # the read budget and the redaction of credentials
    "cord_ops/read_budget.py": [
        "tests/core/test_read_budget.py",
        # a second of CRC over 720 MB per mutant; the smaller archives reach the same lines
        "--deselect=tests/core/test_read_budget.py::test_a_small_npz_that_inflates_to_720_mb_is_refused_by_default"],  # noqa: E501
    "flows/redact.py": ["tests/flows/test_redact.py"],
    "flows/store/owner.py": ["tests/flows/store/test_owner.py"],
    "flows/store/journal.py": ["tests/flows/store/test_journal.py"],
    # without the two tests that fit, export and serve a model (10 s setup per process)
    "flows/serve/contract.py": ["tests/flows/serve/test_contract.py"] + [
        f"tests/flows/serve/test_scoring_input.py::{name}" for name in (
            "test_every_accepted_form_gives_the_same_matrix",
            "test_the_first_non_finite_row_is_named", "test_a_wrong_width_is_refused",
            "test_probability_rows_must_sum_to_one", "test_malformed_inputs_get_their_own_reason",
            "test_a_binary_model_takes_one_score_column_in_every_form",
            "test_a_wrong_width_or_value_is_refused_in_one_line",
            "test_float32_rows_are_renormalised_before_scoring",
            "test_a_float32_graph_gets_the_stored_order_of_a_renormalised_near_tie")],
    # who may hand the warm runner a command; the servers' credential and the
    # owner-only files; a deployment's pinned parameters (its one non-slow end-to-end test
    # starts Prefect's test server once per process)
    "flows/platform/warm_access.py": ["tests/flows/platform/test_warm_access.py"],
    # the one loader of registered graphs (digest checked, no
    # stored code run) and the scoring every reported NLL comes from
    "flows/store/graphs.py": ["tests/flows/store/test_graphs.py"],
    "flows/platform/credential.py": ["tests/flows/platform/test_credential.py"],
    "flows/serve/access.py": ["tests/flows/serve/test_access.py"],
    "flows/platform/pinned.py": [
        "tests/flows/test_schedule.py::test_differences_name_every_parameter_changed_added_or_left_out",  # noqa: E501
        "tests/flows/test_schedule.py::test_outside_a_flow_run_there_is_nothing_to_check",
        "tests/flows/test_schedule.py::test_scheduled_monitoring_skips_while_there_is_no_champion",  # noqa: E501
        "tests/flows/test_schedule.py::test_a_flow_run_with_other_parameters_than_its_deployment_is_refused"],  # noqa: E501
}

# Reasons shared by several of flows/promotion/rules.py's and champion.py's equivalent
# survivors below.
_RULES_COUNTS = ("label counts are integer tuples (label_counts, Evidence); numpy's true "
                "division turns an integer array into float64 exactly as the explicit "
                "dtype does (counts are far below 2**53)")
_CHAMPION_TIMELINE = ("unconfirmed is False only before the first row, when timeline is still "
                  "empty; from the second row on it is True, so `timeline and ...` decides "
                  "alone")
_CHAMPION_REPAIRED = ("metrics.nll validates with check_scores, which converts to float64 "
                  "itself; a graph's 'repaired' output is float32 or float64, both converted "
                  "exactly")

# Reasons shared by equivalent survivors of the security modules.
_ARGPARSE_SILENT = ("argparse writes help and errors through _print_message, which falls back "
                    "from a None stream to sys.stderr and ignores a None one (AttributeError): "
                    "with None the parser's messages are dropped as with the StringIO")
_TMP_EXISTS = ("the temporary file exists whenever the body fails: os.open created it and "
               "only the successful os.replace removes it")
_TMP_SUFFIX = ("any random suffix gives a name of cord_ops.atomic's pattern, which is all "
               "the sweep of leftovers needs")

# Reasons shared by several of cord_ops/cord_solve.py's equivalent survivors.
_SOLVE_BUFFER = ("out= only reuses a work buffer: a freshly allocated array holds the same "
                 "values, and every later step reads the array it is given, not buf2")

# Reasons shared by several of cord_ops/cord_kernels.py's equivalent survivors.
_K_LAYOUTS = ("_layouts only decides whether the fast path runs: a failing check returns None "
              "and _validated_pair then raises with the right names and class count; a "
              "check left out on one array is still made by the other array's check or the "
              "shape comparison, so the same arrays reach the fast path")
_K_REDUCE_AXIS = "a ufunc's reduce defaults to axis=0: the same reduction"
_K_MAX_FINITE = ("the maxima are read only by probability_rows_ok's finiteness test; every "
                 "entry is finite exactly when the global maximum (or every column's) is, as "
                 "when every row's is (NaN propagates through maximum)")
_K_BLOCK_UNREAD = ("probability_rows_ok reads its block only to sum rows when sums is None; "
                   "here sums is given")
_K_OVERWRITTEN = ("the overflow rows are overwritten whole by (tiny / tail) * (1 - s) two lines "
                  "on; a factor of 0, 1 or NaN there only decides values that are replaced, "
                  "and none of them raises a floating-point warning")
_K_UNREACHABLE = ("_validated_pair raises whenever _layouts returns None (the same checks "
                  "plus the value checks), so this line never runs: its message is never seen")
_K_KERNEL_CHOICE = ("the column-wise and row-wise block kernels give the same results bit for "
                    "bit (test_blocks_layouts_and_screening_do_not_change_a_bit); which one "
                    "runs is a speed choice")
_K_LAST_WORD = ("with no block result every block takes the whole-array check (which raises "
                "the usual error on a bad input) and then the unchecked kernel: the same "
                "terms, slower")
_K_BLOCK_FAILED = ("at this call (a block check failed) _layouts has already passed both "
                   "arrays' widths against n_classes, so the count adds nothing; the call "
                   "before the AssertionError is pinned by test_cord_pieces.py")
_K_ORDER = ("numpy reads the order letter case-insensitively, and 'K' (None or left out) "
            "keeps the transposed F layout: the same values, and every later step is "
            "elementwise or a reduction along axis 0, exact in any layout")
_K_ONE_ROW = ("the validation messages name one row each ('row i ...'), so renumbering the "
              "first match or every match is the same")

# Reasons shared by several of cord_ops/calibrators/temperature.py's equivalent survivors.
_TS_PREDICT = ("softmax's overwrite only says whether it may compute in its argument, here "
               "the fresh product beta_ * logits, which nothing else holds: same values bit "
               "for bit (softmax's docstring)")
_TS_NAME = ("name=self.name passes 'ts', which is also the parameter's default, and no "
            "calibrator subclasses TemperatureScaling")
_TS_SCIPY_METHOD = ("scipy's minimize_scalar lower-cases the method name, and with bounds "
                    "given and no method it chooses 'bounded' itself")
_TS_MSE_MAXITER = ("bounded Brent to xatol 1e-10 on [0.05, 5] stops after about 60 steps, "
                   "far below either cap")
_TS_MSE_SCALE = ("bounded Brent only compares values and fits parabolas through them, both "
                 "unchanged by a positive factor (n K) on the objective")
_TS_EINSUM = "einsum subscripts are letters: upper case names the same axes"
_TS_GRID_END = ("without the grid point 16 the best point is at most 15.75, whose window "
                "min(15.75 + 0.25, 16) still reaches 16: the same bounded search")

# Reasons shared by several of cord_ops/metrics.py's equivalent survivors.
_M_DTYPE = "numpy's default dtype (dtype None) is float64: the same array"
_M_SIDE = "side='left' is searchsorted's default"
_M_CONF_POSITIVE = ("a top-1 probability is at least (1 - 1e-4) / K > 0, so searchsorted never "
                    "returns 0 and no bin index is below 0: the lower clip never acts")
_M_GRID_POSITIVE = ("confidences and evaluation points lie in [0, 1], so the grid index "
                    "f (m - 1) truncates to >= 0: the lower clip never acts")
_M_FFT_AXES = ("the kernel is (1, m): convolving over axis 0 too is a 'valid' convolution with "
               "a length-1 unit kernel, the identity (FFT rounding ~1e-16, far below relplot "
               "parity's 1e-9)")
_M_STABLE = "numpy lower-cases the sort kind: 'STABLE' is 'stable'"
_M_EM_CAP = ("rank r <= n - 1 gives floor(r B / n) <= B - 1, so the cap min(B - 1, .) never "
             "acts, at B - 1 or B + 1")
_M_EM_DIV = ("r B / n is a quotient of integers: when it is not an integer it is at least 1/n "
             "from one, far above its rounding, so the int64 cast truncates it to the same "
             "floor")
_M_DIVIDE = ("an empty bin divides 0 by 0, which numpy reports as 'invalid', never as 'divide' "
             "(a filled bin has a count >= 1): the divide setting is never consulted")
_M_SMECE_EPS = ("the bandwidths tried are 1 and dyadic midpoints 2^-k, never exactly "
                "SMECE_EPS = 1e-3")
_M_SMECE_TIE = ("differs only where smECE_sigma equals the dyadic sigma exactly; no input "
                "found reaches that tie, and relplot's smECE (the parity tests) decides "
                "the same strict way")

# Reasons shared by several of cord_ops/validation.py's equivalent survivors.
_V_KINDS = ("'X' is no numpy dtype kind: the kind test with 'XX' around the letters accepts "
            "and refuses exactly the same dtypes")
_V_FLOAT64 = "numpy's default dtype (dtype None) is float64: the same conversion"
_V_COPY_NONE = "astype's copy=None copies only when needed, as copy=False does"
_V_COLUMN_COPY = ("the converted column is only read (checks, 1 - p, column_stack builds a new "
                  "array): whether astype copied it cannot be seen")
_V_RESHAPE = ("np.unique's inverse of a 1-D array (the only kind that gets here) is already "
              "1-D; reshape(None) leaves it as it is, like reshape(-1)")
_V_TWO_COLUMNS = ("_column gets only what is_one_column accepts ((n,) or (n, 1), which "
                  "stored_scores checks): an (n, 1) column kept 2-D gives the same "
                  "checks, row numbers, values and n x 2 column_stack")

# Reasons shared by several of flows/serve/contract.py's equivalent survivors.
_C_KINDS = ("'X' is no numpy or pandas dtype kind: the kind test with 'XX' around the letters "
            "accepts and refuses exactly the same dtypes")

_C_ONE_COLUMN_FRAME = ("a one-column numeric frame read through _list_array is np.asarray of its "
                       "numbers: the same values and dtype as frame.to_numpy()")
_C_ONLY_NONE = ("the only scalar that reaches this line is None (numbers return above as a "
                "numeric array, str and bool are refused above): isscalar(None) is False as "
                "isscalar(value) is")

# Reasons shared by several of cord_ops/reduce.py's equivalent survivors.
_R_STRICT = ("alphas gets one entry per memory pair in the first loop, so the second loop's "
             "zip has equal lengths: strict never raises")
_R_OPTIONS = ("the options drop input_kind and prob_floor, the only constructor parameters "
              "input_kind sets: the same defaults for either kind")
_R_FLOOR = ("cal is read only for its prob_floor, whose default (machine epsilon) is the same "
            "for logits and probabilities")
_R_TS_CAL = "cal is read only for its prob_floor, which max_iter does not set"
_R_TS_NAME = "name='ts' is solve_inverse_temperature's default"
_R_START_K = "_vs_start never reads k (the sample's width is K)"
_R_NEVER_EQUAL = ("a screened estimate is returned only when further than the margin (> 0) "
                  "from mu, so it never equals mu")


_R_SCREEN_OFF = "screening is read only as `not self.screening`: None is false like False"
_P_FRACTION_PATH = ("both paths are exact for every finite value; the limb path needs only "
                    "C = 1.5 * 2^(bound + 21) finite, i.e. values below 2^1002, so a threshold "
                    "of 2^960, 2^961 or 1920 decides only which exact path runs")
_P_EMPTY = ("range(0, size, _CHUNK) never yields an empty chunk, so rest.size is never 0 and "
            "this else-value is never used")
_P_LIMBS = ("a limb of at most 2^32 units of 2^scale (bound one lower or higher than needed) "
            "still sums exactly: 2^21 of them stay within 2^53")
_P_LOOP_END = ("every remainder is an exact multiple of 2^-1074, so the rest is all zero by "
               "scale -1074 at the latest; zero limbs add 0: the same total, more rounds")
_P_UPPER_ARRAY = ("a 0-d array of 1 - 1e-12 broadcasts against g: the same per-row doubles "
                  "(checked bit for bit), so the same maximum")
_P_ETA_ONE = ("at eta = 1 both forms are sqrt(g) to rounding, an estimate the screen allows "
              "for (7.5 u per row)")

# Reasons shared by flows/store/graphs.py's equivalent survivors.
_G_LISTED = ("MLflow lists an artifact URI's files as '<its last folder>/<name>' (one '/'), so "
             "rsplit('/', 1)[-1], [+1], rsplit('/'), rsplit('/', 2) and split('/', 1) all "
             "give the name")
_G_SCRATCH = ("the name of a scratch folder inside a folder the caller made (or a temporary "
              "one removed on return): nothing reads it by name, and every file is found by "
              "the path the download returns")
_G_LAYOUT = ("whitespace of the manifest's JSON: its digest is taken of the bytes written, and "
             "every reader parses the JSON; sorted keys (what makes the digest independent of "
             "the order of the run digests) are tested")
_G_RUN_URI = ("MLflow makes a run's artifact URI '<experiment location>/<run id>/artifacts': "
              "it never ends in '/' or 'X', so either strip at its end leaves it as it is")
_G_SPIN = "open_session reads spin only as `if not spin`: None is false like False"
_G_CHUNK = ("the chunk size of the SHA-256 read (read(None): the whole file): the same bytes "
            "in the same order give the same digest")

#: Survivors shown to be equivalent (no test can tell them from the original), with why.
# Reasons shared by flows/serve/access.py's equivalent survivors.
_ONE_COLON = ("under host.count(':') == 1 split and rsplit, with any maxsplit, cut at the "
              "same colon")
_HEADERS_ANY_CASE = "Starlette's Headers look names up case-insensitively"

# Reasons shared by cord_ops/select.py's equivalent survivors.
_SEL_ZIP = ("the results hold one entry per fold (a loop over the folds, or joblib's one "
            "result per task), so zip never meets unequal lengths: strict only adds a check")
_SEL_BREAK = ("choose walks the families simplest first, (rank, name) ascending, and best is "
              "one of them: it meets best before any family ranked after it, so the "
              "`name == best` test alone ends the walk; a second clause that is false for "
              "every family before best changes nothing: >= is equal only at best itself; "
              "rank(None) is 12, which no family's rank exceeds, and a family ranked 12 "
              "before best is unlisted like best and its name sorts first")

# Reasons shared by cord_ops/label_free.py's equivalent survivors.
_LF_LABELS = ("OneVsRestMaps reads its labels only as labels == k: an integer or float array of "
              "class indices gives the same masks whatever its dtype (ReferenceProfile hands "
              "it check_labels' int64)")
_LF_ASTYPE_NONE = "astype(None) is astype(float64), numpy's default dtype"
_LF_MATMUL = ("@ with the float64 label shares converts any integer or float array to float64 "
              "exactly: the same products and sum")
_LF_SOURCE = ("the source priors are read only as the divisor of the float64 target priors and "
              "in source > 0: numpy converts them to float64 exactly for both")
_LF_COUNTS = ("the label counts are only multiplied by the float64 weights, which converts "
              "them to float64 exactly")
_LF_KS = ("ks_2samp's statistic and p-value depend only on the sample sizes and the order of "
          "the pooled values, which the exact float64 conversion keeps (checked: float32, "
          "mixed and float64 samples give the same figures bit for bit)")
_LF_CHI2 = ("chi2_contingency computes the expected frequencies in float64 and the statistic "
            "from observed - expected, which converts an integer or float table exactly: the "
            "same figures bit for bit; the checks read the same counts")
_LF_READS_NONE = ("_reads (and _fit_maps) treat every recipe but ONE_VS_REST as the class "
                  "maps': None reads the same top-1 confidence")
_LF_ONE_ROW = ("the floor only changes the divisor of a class with 0 or 1 labelled rows, whose "
               "class_cbpe_var_ is 0: its term of the standard error is 0 either way")
_LF_BOUNDS = ("the maps' targets are 0/1 (top-1 correctness, label == k): an isotonic fit's "
              "values are means of pooled targets, within [0, 1] without the bounds (and "
              "within [0, 2])")
_LF_RIGHT = ("IsotonicRegression.fit converts y to X's dtype, and X (the confidences) is "
             "float64 here: bool, integer or float correctness give the same float64 targets")
_LF_FOLDS = "KFold's n_splits defaults to 5, which is RECIPE_FOLDS"
_LF_LABELS_NAME = "check_labels' name defaults to \"labels\", the name passed"
_LF_REFIT = ("for the class-maps recipe the prior route's maps are then fitted again on the "
             "same rows by the same call: equal maps (for one vs rest they are fitted anyway)")
_LF_FIT_LABELS = ("_fit_maps reads the labels only for ONE_VS_REST; the class maps take the "
                  "correctness instead")
_LF_ATC_ORDER = ("ATC's threshold is one of the confidences, picked by its rank: any integer or "
                 "float array ranks the same and converts exactly to the same float")
_LF_INF = "float() reads \"INF\" case-insensitively: the same inf"
_LF_TV = ("only one side is left unconverted: the other is float64, so the difference is "
          "taken in float64 of the exact conversion, the same figure")
_LF_ALL_ZERO = ("all-zero weights send every row to zero, and such rows are given back as "
                "they were: the same rows as the copy")
_LF_SUM_BOUND = ("differs only when a sum of priors misses 1 by exactly the double 1e-6; no "
                 "two-prior sum near 1 + 1e-6 does (searched 6,000 neighbouring doubles)")
_LF_INCREASING = "IsotonicRegression's increasing defaults to True"
_LF_YATES = ("chi2_contingency applies Yates' correction only `if correction and dof == 1`: "
             "None is false like False")
_LF_GAP_EQUAL = ("differs only when the gap equals the tolerance to the last bit (the "
                 "docstring: rejected when the gap is *above* it); both are sums of computed "
                 "floats, with tolerance >= LABEL_SHIFT_FLOOR, and no batch constructed here "
                 "reaches the tie")

ACCEPTED: dict[str, str] = {
    # cord_ops/select.py
    "cord_ops/select.py::_score::for (_, test), (rep, cal, _, _) in zip(folds, results, strict=True): -> for (_, test), (rep, cal, _, _) in zip(folds, results, strict=None):":  # noqa: E501 - a key is one source line
        _SEL_ZIP,
    "cord_ops/select.py::_score::for (_, test), (rep, cal, _, _) in zip(folds, results, strict=True): -> for (_, test), (rep, cal, _, _) in zip(folds, results, ):":  # noqa: E501 - a key is one source line
        _SEL_ZIP,
    "cord_ops/select.py::_score::for (_, test), (rep, cal, _, _) in zip(folds, results, strict=True): -> for (_, test), (rep, cal, _, _) in zip(folds, results, strict=False):":  # noqa: E501 - a key is one source line
        _SEL_ZIP,
    'cord_ops/select.py::_score::if len(np.unique(labels)) == 2 else float("nan")) -> if len(np.unique(labels)) == 2 else float("NAN"))':  # noqa: E501 - a key is one source line
        "float() reads 'nan' case-insensitively: the same NaN",
    "cord_ops/select.py::choose::if name == best or (rank(name), name) > (rank(best), best): -> if name == best or (rank(name), name) >= (rank(best), best):":  # noqa: E501 - a key is one source line
        _SEL_BREAK,
    "cord_ops/select.py::choose::if name == best or (rank(name), name) > (rank(best), best): -> if name == best or (rank(name), name) > (rank(None), best):":  # noqa: E501 - a key is one source line
        _SEL_BREAK,
    # cord_ops/cord_solve.py: the screen is an optimisation; the exact mean decides the same
    # way
    "cord_ops/cord_solve.py::_MeanResponse.at_least::approx = self._screened(eta, mu) -> "
    "approx = None":
        "without the screen every step asks the exact mean, which the screen agrees with "
        "(it answers only when |approx - mu| > 4x the error bound): slower, same result",
    "cord_ops/cord_solve.py::_MeanResponse.at_least::return self.exact(eta) >= mu if approx is "
    "None else approx > mu -> return self.exact(eta) >= mu if (approx is None) or True else "
    "approx > mu":
        "always the exact mean: same decisions as the screen (see the line above)",
    "cord_ops/cord_solve.py::_MeanResponse.at_least::return self.exact(eta) >= mu if approx is "
    "None else approx > mu -> return self.exact(eta) >= mu if approx is None else approx >= mu":
        "a screened approx is never equal to mu (it is returned only when further than the "
        "margin from it)",
    "cord_ops/cord_solve.py::_MeanResponse.at_most::approx = self._screened(eta, mu) -> "
    "approx = None":
        "as for at_least: the exact mean decides the same way",
    "cord_ops/cord_solve.py::_MeanResponse.at_most::return self.exact(eta) <= mu if approx is "
    "None else approx < mu -> return self.exact(eta) <= mu if (approx is None) or True else "
    "approx < mu":
        "as for at_least",
    "cord_ops/cord_solve.py::_MeanResponse.at_most::return self.exact(eta) <= mu if approx is "
    "None else approx < mu -> return self.exact(eta) <= mu if approx is None else approx <= mu":
        "as for at_least: a screened approx is never equal to mu",
    'cord_ops/cord_solve.py::_MeanResponse.approximate::x = np.add(eta, self.shift, '
    'out=self.buf2) -> x = np.add(eta, self.shift, out=None)': _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.approximate::x = np.add(eta, self.shift, '
    'out=self.buf2) -> x = np.add(eta, self.shift, )': _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.approximate::return self._finish(eta, np.sqrt(x, '
    'out=x)) -> return self._finish(eta, np.sqrt(x, out=None))': _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.approximate::return self._finish(eta, np.sqrt(x, '
    'out=x)) -> return self._finish(eta, np.sqrt(x, ))': _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.exact::x = np.add(eta, self.shift, '
    'out=self.buf2) -> x = np.add(eta, self.shift, out=None)': _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.exact::x = np.add(eta, self.shift, '
    'out=self.buf2) -> x = np.add(eta, self.shift, )': _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.exact::return self._finish(eta, np.hypot(x, '
    'self.y, out=self.buf2)) -> return self._finish(eta, np.hypot(x, self.y, out=None))':
        _SOLVE_BUFFER,
    'cord_ops/cord_solve.py::_MeanResponse.exact::return self._finish(eta, np.hypot(x, '
    'self.y, out=self.buf2)) -> return self._finish(eta, np.hypot(x, self.y, ))':
        _SOLVE_BUFFER,
    "cord_ops/cord_solve.py::bisect_multiplier::if at_zero < mu: -> if at_zero <= mu:":
        "at_zero == mu has already returned 0.0 on the line above, so < and <= agree",
    "cord_ops/cord_solve.py::_MeanResponse._screened::self.screening = False -> "
    "self.screening = None":
        "screening is only read as `if not self.screening`, where None is False",
    # cord_ops/cord_kernels.py and cord_ops/cord.py
    'cord_ops/cord_kernels.py::_layouts::p0 = check_layout(original, "original", n_classes=n_classes) -> p0 = check_layout(original, None, n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::p0 = check_layout(original, "original", n_classes=n_classes) -> p0 = check_layout(original, "original", n_classes=None)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::p0 = check_layout(original, "original", n_classes=n_classes) -> p0 = check_layout(original, n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::p0 = check_layout(original, "original", n_classes=n_classes) -> p0 = check_layout(original, "original", )':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::p0 = check_layout(original, "original", n_classes=n_classes) -> p0 = check_layout(original, "XXoriginalXX", n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::p0 = check_layout(original, "original", n_classes=n_classes) -> p0 = check_layout(original, "ORIGINAL", n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::q = check_layout(calibrated, "calibrated", n_classes=n_classes) -> q = check_layout(calibrated, None, n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::q = check_layout(calibrated, "calibrated", n_classes=n_classes) -> q = check_layout(calibrated, "calibrated", n_classes=None)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::q = check_layout(calibrated, "calibrated", n_classes=n_classes) -> q = check_layout(calibrated, n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::q = check_layout(calibrated, "calibrated", n_classes=n_classes) -> q = check_layout(calibrated, "calibrated", )':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::q = check_layout(calibrated, "calibrated", n_classes=n_classes) -> q = check_layout(calibrated, "XXcalibratedXX", n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::_layouts::q = check_layout(calibrated, "calibrated", n_classes=n_classes) -> q = check_layout(calibrated, "CALIBRATED", n_classes=n_classes)':  # noqa: E501 - a key is one source line
        _K_LAYOUTS,
    'cord_ops/cord_kernels.py::stabilize::return (1.0 - DELTA_STAB) * u + DELTA_STAB / u.shape[-1] -> return (1.0 - DELTA_STAB) * u + DELTA_STAB / u.shape[+1]':  # noqa: E501 - a key is one source line
        "stabilize is given only 2-D row blocks, whose shape[1] is shape[-1]",
    'cord_ops/cord_kernels.py::_columns_block::p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=0) -> p_min, p_max = np.minimum.reduce(pt, ), np.maximum.reduce(pt, axis=0)':  # noqa: E501 - a key is one source line
        _K_REDUCE_AXIS,
    'cord_ops/cord_kernels.py::_columns_block::p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=0) -> p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, )':  # noqa: E501 - a key is one source line
        _K_REDUCE_AXIS,
    'cord_ops/cord_kernels.py::_columns_block::p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=0) -> p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=None)':  # noqa: E501 - a key is one source line
        _K_MAX_FINITE,
    'cord_ops/cord_kernels.py::_columns_block::p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=0) -> p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=1)':  # noqa: E501 - a key is one source line
        _K_MAX_FINITE,
    'cord_ops/cord_kernels.py::_columns_block::q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=0) -> q_min, q_max = np.minimum.reduce(qt, ), np.maximum.reduce(qt, axis=0)':  # noqa: E501 - a key is one source line
        _K_REDUCE_AXIS,
    'cord_ops/cord_kernels.py::_columns_block::q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=0) -> q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, )':  # noqa: E501 - a key is one source line
        _K_REDUCE_AXIS,
    'cord_ops/cord_kernels.py::_columns_block::q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=0) -> q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=None)':  # noqa: E501 - a key is one source line
        _K_MAX_FINITE,
    'cord_ops/cord_kernels.py::_columns_block::q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=0) -> q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=1)':  # noqa: E501 - a key is one source line
        _K_MAX_FINITE,
    'cord_ops/cord_kernels.py::_columns_block::tail, runner_up = pairwise_column_sum(qt), np.maximum.reduce(qt, axis=0) -> tail, runner_up = pairwise_column_sum(qt), np.maximum.reduce(qt, )':  # noqa: E501 - a key is one source line
        _K_REDUCE_AXIS,
    'cord_ops/cord_kernels.py::_columns_block::if check and not (probability_rows_ok(pt, p_min, p_max, sums=pairwise_column_sum(pt)) -> if check and not (probability_rows_ok(None, p_min, p_max, sums=pairwise_column_sum(pt))':  # noqa: E501 - a key is one source line
        _K_BLOCK_UNREAD,
    'cord_ops/cord_kernels.py::_columns_block::and probability_rows_ok(qt, q_min, q_max, -> and probability_rows_ok(None, q_min, q_max,':  # noqa: E501 - a key is one source line
        _K_BLOCK_UNREAD,
    'cord_ops/cord_kernels.py::_reconstruct::factor[overflow] = 0.0 -> factor[overflow] = None':  # noqa: E501 - a key is one source line
        _K_OVERWRITTEN,
    'cord_ops/cord_kernels.py::_reconstruct::factor[overflow] = 0.0 -> factor[overflow] = 1.0':  # noqa: E501 - a key is one source line
        _K_OVERWRITTEN,
    'cord_ops/cord_kernels.py::_reconstruct::kept = out[same] if any_same else None # fancy indexing copies the rows -> kept = out[same] if (any_same) or True else None # fancy indexing copies the rows':  # noqa: E501 - a key is one source line
        "kept is read only under `if any_same`; without such rows it is an unused empty copy",
    'cord_ops/cord_kernels.py::pairwise_column_sum::total = columns[0] + 0.0 -> total = columns[0] - 0.0':  # noqa: E501 - a key is one source line
        ("x - 0.0 equals x + 0.0 for every x but -0.0, whose sum's sign then differs only "
         "while every later entry is a zero too; no row of probabilities (sum ~ 1) nor "
         "tail (positive after stabilisation) is such a sum"),
    'cord_ops/cord_kernels.py::_global_row::count=1) -> )':  # noqa: E501 - a key is one source line
        _K_ONE_ROW,
    'cord_ops/cord_kernels.py::_global_row::count=1) -> count=2)':  # noqa: E501 - a key is one source line
        _K_ONE_ROW,
    'cord_ops/cord.py::minimal_repair::terms = sweep(original, calibrated, 0.5, keep_rest=True) -> terms = sweep(original, calibrated, 1.5, keep_rest=True)':  # noqa: E501 - a key is one source line
        "the local weight only sets g, which minimal_repair never reads (s = Pi_I(b))",
    'cord_ops/cord.py::minimal_repair::out = reconstruct(terms, np.clip(terms.b, terms.lower, terms.upper)) -> out = reconstruct(terms, np.clip(terms.b, terms.lower, None))':  # noqa: E501 - a key is one source line
        ("in a changed row b = q_a is at most q's top entry q_j (j != a), so b <= 1/2 < "
         "upper = 1 - 1e-12, and kept rows are overwritten with q: the upper clip never "
         "acts"),
    'cord_ops/cord.py::CORD.fit_blocks::k = original.shape[1] if k is None else k -> k = original.shape[1] if (k is None) or True else k':  # noqa: E501 - a key is one source line
        ("from the second block on k is already set and row_scalars has just checked the "
         "block against n_classes=k, so original.shape[1] == k"),
    'cord_ops/cord_kernels.py::sweep::raise AssertionError("unreachable: the layout checks above failed") -> raise AssertionError(None)':  # noqa: E501 - a key is one source line
        _K_UNREACHABLE,
    'cord_ops/cord_kernels.py::sweep::raise AssertionError("unreachable: the layout checks above failed") -> raise AssertionError("XXunreachable: the layout checks above failedXX")':  # noqa: E501 - a key is one source line
        _K_UNREACHABLE,
    'cord_ops/cord_kernels.py::sweep::raise AssertionError("unreachable: the layout checks above failed") -> raise AssertionError("UNREACHABLE: THE LAYOUT CHECKS ABOVE FAILED")':  # noqa: E501 - a key is one source line
        _K_UNREACHABLE,
    'cord_ops/cord_kernels.py::sweep::block_terms = _columns_block if k <= COLUMNWISE_MAX_K else _rows_block -> block_terms = _columns_block if (k <= COLUMNWISE_MAX_K) and False else _rows_block':  # noqa: E501 - a key is one source line
        _K_KERNEL_CHOICE,
    'cord_ops/cord_kernels.py::sweep::block_terms = _columns_block if k <= COLUMNWISE_MAX_K else _rows_block -> block_terms = _columns_block if (k <= COLUMNWISE_MAX_K) or True else _rows_block':  # noqa: E501 - a key is one source line
        _K_KERNEL_CHOICE,
    'cord_ops/cord_kernels.py::sweep::block_terms = _columns_block if k <= COLUMNWISE_MAX_K else _rows_block -> block_terms = _columns_block if k < COLUMNWISE_MAX_K else _rows_block':  # noqa: E501 - a key is one source line
        _K_KERNEL_CHOICE,
    'cord_ops/cord_kernels.py::sweep::scratch = np.empty((rows.stop - rows.start, k)) -> scratch = np.empty((rows.stop + rows.start, k))':  # noqa: E501 - a key is one source line
        "scratch is allocated at the first block, whose start is 0: the same size",
    'cord_ops/cord_kernels.py::sweep::found = block_terms(p0[rows], q[rows], rest) -> found = None':  # noqa: E501 - a key is one source line
        _K_LAST_WORD,
    'cord_ops/cord_kernels.py::sweep::_validated_pair(original, calibrated, n_classes) -> _validated_pair(original, calibrated, None)':  # noqa: E501 - a key is one source line
        _K_BLOCK_FAILED,
    'cord_ops/cord_kernels.py::sweep::_validated_pair(original, calibrated, n_classes) -> _validated_pair(original, calibrated, )':  # noqa: E501 - a key is one source line
        _K_BLOCK_FAILED,
    'cord_ops/cord_kernels.py::_columns_block::pt = np.array(pb.T, dtype=np.float64, order="C") -> pt = np.array(pb.T, dtype=np.float64, order=None)':  # noqa: E501 - a key is one source line
        _K_ORDER,
    'cord_ops/cord_kernels.py::_columns_block::pt = np.array(pb.T, dtype=np.float64, order="C") -> pt = np.array(pb.T, dtype=np.float64, )':  # noqa: E501 - a key is one source line
        _K_ORDER,
    'cord_ops/cord_kernels.py::_columns_block::pt = np.array(pb.T, dtype=np.float64, order="C") -> pt = np.array(pb.T, dtype=np.float64, order="c")':  # noqa: E501 - a key is one source line
        _K_ORDER,
    'cord_ops/cord_kernels.py::_columns_block::qt = np.array(qb.T, dtype=np.float64, order="C") -> qt = np.array(qb.T, dtype=np.float64, order=None)':  # noqa: E501 - a key is one source line
        _K_ORDER,
    'cord_ops/cord_kernels.py::_columns_block::qt = np.array(qb.T, dtype=np.float64, order="C") -> qt = np.array(qb.T, dtype=np.float64, )':  # noqa: E501 - a key is one source line
        _K_ORDER,
    'cord_ops/cord_kernels.py::_columns_block::qt = np.array(qb.T, dtype=np.float64, order="C") -> qt = np.array(qb.T, dtype=np.float64, order="c")':  # noqa: E501 - a key is one source line
        _K_ORDER,
    'cord_ops/cord_kernels.py::sweep::found = block_terms(p0[rows], q[rows], rest, check=False) -> found = block_terms(p0[rows], q[rows], rest, check=None)':  # noqa: E501 - a key is one source line
        "check is only read as `if check and ...`, where None is False",
    # cord_ops/calibrators/temperature.py
    'cord_ops/calibrators/temperature.py::bracketed_iteration::if g == 0.0: -> if g == 1.0:':
        'at g == 0 the step is 0, which the convergence test returns: same beta',
    'cord_ops/calibrators/temperature.py::bracketed_iteration::if g > 0.0: -> if g >= 0.0:':
        'g == 0 has returned just above',
    'cord_ops/calibrators/temperature.py::slope_kernel::mean_z = np.einsum("ik,ik->i", e, z) / total -> mean_z = np.einsum("IK,IK->I", e, z) / total':  # noqa: E501 - a key is one source line
        'einsum subscripts are letters: upper case names the same axes',
    'cord_ops/calibrators/temperature.py::slope_kernel::mean_z2 = np.einsum("ik,ik->i", e, z2) / total -> mean_z2 = np.einsum("IK,IK->I", e, z2) / total':  # noqa: E501 - a key is one source line
        'einsum subscripts are letters: upper case names the same axes',
    'cord_ops/calibrators/temperature.py::solve_inverse_temperature::while g_lo > 0.0 and lo > BETA_BOUNDS[0]: -> while g_lo >= 0.0 and lo > BETA_BOUNDS[0]:':  # noqa: E501 - a key is one source line
        'a zero slope at lo moves it to hi, which the exact-zero return gives back: same beta',
    'cord_ops/calibrators/temperature.py::solve_inverse_temperature::flat_top = g_hi == 0.0 and h_hi == 0.0 and hi > 1.0 -> flat_top = g_hi == 0.0 and h_hi == 0.0 and hi > 2.0':  # noqa: E501 - a key is one source line
        'hi is a power of 4 here: never in (1, 2]',
    'cord_ops/calibrators/temperature.py::TemperatureScaling._predict::return softmax(self.beta_ * self._logits(x), overwrite=True) -> return softmax(self.beta_ * self._logits(x), overwrite=None)':  # noqa: E501 - a key is one source line
        _TS_PREDICT,
    'cord_ops/calibrators/temperature.py::TemperatureScaling._predict::return softmax(self.beta_ * self._logits(x), overwrite=True) -> return softmax(self.beta_ * self._logits(x), )':  # noqa: E501 - a key is one source line
        _TS_PREDICT,
    'cord_ops/calibrators/temperature.py::TemperatureScaling._predict::return softmax(self.beta_ * self._logits(x), overwrite=True) -> return softmax(self.beta_ * self._logits(x), overwrite=False)':  # noqa: E501 - a key is one source line
        _TS_PREDICT,
    'cord_ops/calibrators/temperature.py::TemperatureScaling._fit::name=self.name)) -> ))':  # noqa: E501 - a key is one source line
        _TS_NAME,
    'cord_ops/calibrators/temperature.py::bounded_refit::found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), method="bounded", -> found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), method=None,':  # noqa: E501 - a key is one source line
        _TS_SCIPY_METHOD,
    'cord_ops/calibrators/temperature.py::bounded_refit::found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), method="bounded", -> found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), method="BOUNDED",':  # noqa: E501 - a key is one source line
        _TS_SCIPY_METHOD,
    'cord_ops/calibrators/temperature.py::bounded_refit::found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), method="bounded", | bounds=(max(best - 0.25, -16.0), min(best + 0.25, 16.0)), -> found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), bounds=(max(best - 0.25, -16.0), min(best + 0.25, 16.0)),':  # noqa: E501 - a key is one source line
        _TS_SCIPY_METHOD,
    'cord_ops/calibrators/temperature.py::fit_inverse_temperature_mse::t = minimize_scalar(mse, bounds=(lo, hi), method="bounded", -> t = minimize_scalar(mse, bounds=(lo, hi), method=None,':  # noqa: E501 - a key is one source line
        _TS_SCIPY_METHOD,
    'cord_ops/calibrators/temperature.py::fit_inverse_temperature_mse::t = minimize_scalar(mse, bounds=(lo, hi), method="bounded", -> t = minimize_scalar(mse, bounds=(lo, hi), method="BOUNDED",':  # noqa: E501 - a key is one source line
        _TS_SCIPY_METHOD,
    'cord_ops/calibrators/temperature.py::fit_inverse_temperature_mse::t = minimize_scalar(mse, bounds=(lo, hi), method="bounded", | options={"xatol": 1e-10, "maxiter": 500}).x -> t = minimize_scalar(mse, bounds=(lo, hi), options={"xatol": 1e-10, "maxiter": 500}).x':  # noqa: E501 - a key is one source line
        _TS_SCIPY_METHOD,
    'cord_ops/calibrators/temperature.py::fit_inverse_temperature_mse::options={"xatol": 1e-10, "maxiter": 500}).x -> options={"xatol": 1e-10, "maxiter": 501}).x':  # noqa: E501 - a key is one source line
        _TS_MSE_MAXITER,
    'cord_ops/calibrators/temperature.py::fit_inverse_temperature_mse::return float(np.einsum("ij,ij->", q, q)) / q.size -> return float(np.einsum("ij,ij->", q, q)) * q.size':  # noqa: E501 - a key is one source line
        _TS_MSE_SCALE,
    'cord_ops/calibrators/temperature.py::fit_inverse_temperature_mse::return float(np.einsum("ij,ij->", q, q)) / q.size -> return float(np.einsum("IJ,IJ->", q, q)) / q.size':  # noqa: E501 - a key is one source line
        _TS_EINSUM,
    'cord_ops/calibrators/temperature.py::bounded_refit::grid = np.arange(-16.0, 16.0 + 1e-9, 0.25) -> grid = np.arange(-16.0, 16.0 - 1e-9, 0.25)':  # noqa: E501 - a key is one source line
        _TS_GRID_END,
    # cord_ops/metrics.py
    'cord_ops/metrics.py::_confidence_correct::return confidence, (pred == y).astype(np.float64) -> return confidence, (pred == y).astype(None)':  # noqa: E501 - a key is one source line
        _M_DTYPE,
    'cord_ops/metrics.py::_equal_width_bins::bins = np.searchsorted(edges, confidence, side="left") - 1 -> bins = np.searchsorted(edges, confidence, ) - 1':  # noqa: E501 - a key is one source line
        _M_SIDE,
    'cord_ops/metrics.py::_equal_width_bins::return edges, np.clip(bins, 0, n_bins - 1) -> return edges, np.clip(bins, None, n_bins - 1)':  # noqa: E501 - a key is one source line
        _M_CONF_POSITIVE,
    'cord_ops/metrics.py::_interpolate::left = (t * (m - 1)).astype(np.int64).clip(0, m - 2) -> left = (t * (m - 1)).astype(np.int64).clip(None, m - 2)':  # noqa: E501 - a key is one source line
        _M_GRID_POSITIVE,
    'cord_ops/metrics.py::_smooth_to_grid::left = scaled.astype(np.int64).clip(0, grid_points - 2) -> left = scaled.astype(np.int64).clip(None, grid_points - 2)':  # noqa: E501 - a key is one source line
        _M_GRID_POSITIVE,
    'cord_ops/metrics.py::_reflected_gaussian_smooth::smoothed = fftconvolve(mirrored, kernel[None, :], mode="valid", axes=1) -> smoothed = fftconvolve(mirrored, kernel[None, :], mode="valid", axes=None)':  # noqa: E501 - a key is one source line
        _M_FFT_AXES,
    'cord_ops/metrics.py::_reflected_gaussian_smooth::smoothed = fftconvolve(mirrored, kernel[None, :], mode="valid", axes=1) -> smoothed = fftconvolve(mirrored, kernel[None, :], mode="valid", )':  # noqa: E501 - a key is one source line
        _M_FFT_AXES,
    'cord_ops/metrics.py::ece_em::order = np.argsort(confidence, kind="stable") -> order = np.argsort(confidence, kind="STABLE")':  # noqa: E501 - a key is one source line
        _M_STABLE,
    'cord_ops/metrics.py::ece_em::bins[order] = np.minimum(n_bins - 1, (np.arange(n) * n_bins) // n) -> bins[order] = np.minimum(n_bins + 1, (np.arange(n) * n_bins) // n)':  # noqa: E501 - a key is one source line
        _M_EM_CAP,
    'cord_ops/metrics.py::ece_em::bins[order] = np.minimum(n_bins - 1, (np.arange(n) * n_bins) // n) -> bins[order] = np.minimum(n_bins - 1, (np.arange(n) * n_bins) / n)':  # noqa: E501 - a key is one source line
        _M_EM_DIV,
    'cord_ops/metrics.py::reliability_diagram::with np.errstate(invalid="ignore", divide="ignore"): -> with np.errstate(invalid="ignore", divide=None):':  # noqa: E501 - a key is one source line
        _M_DIVIDE,
    'cord_ops/metrics.py::reliability_diagram::with np.errstate(invalid="ignore", divide="ignore"): -> with np.errstate(invalid="ignore", ):':  # noqa: E501 - a key is one source line
        _M_DIVIDE,
    'cord_ops/metrics.py::smece_with_width::return sigma < SMECE_EPS or sigma < value(sigma) -> return sigma <= SMECE_EPS or sigma < value(sigma)':  # noqa: E501 - a key is one source line
        _M_SMECE_EPS,
    'cord_ops/metrics.py::smece_with_width::return sigma < SMECE_EPS or sigma < value(sigma) -> return sigma < SMECE_EPS or sigma <= value(sigma)':  # noqa: E501 - a key is one source line
        _M_SMECE_TIE,
    # cord_ops/validation.py
    'cord_ops/validation.py::check_class_labels::if arr.dtype.kind not in "USbO": -> if arr.dtype.kind not in "XXUSbOXX":':  # noqa: E501 - a key is one source line
        _V_KINDS,
    'cord_ops/validation.py::check_class_labels::if arr.dtype != object and arr.dtype.kind in "iuf": -> if arr.dtype != object and arr.dtype.kind in "XXiufXX":':  # noqa: E501 - a key is one source line
        _V_KINDS,
    'cord_ops/validation.py::check_labels::if arr.dtype == object or arr.dtype.kind not in "iuf": -> if arr.dtype == object or arr.dtype.kind not in "XXiufXX":':  # noqa: E501 - a key is one source line
        _V_KINDS,
    'cord_ops/validation.py::check_layout::if arr.dtype == object or arr.dtype.kind not in "iuf": -> if arr.dtype == object or arr.dtype.kind not in "XXiufXX":':  # noqa: E501 - a key is one source line
        _V_KINDS,
    'cord_ops/validation.py::_one_column_values::if arr.dtype == object or arr.dtype.kind not in "iuf": -> if arr.dtype == object or arr.dtype.kind not in "XXiufXX":':  # noqa: E501 - a key is one source line
        _V_KINDS,
    'cord_ops/validation.py::check_scores::arr = check_layout(x, name, n_classes=n_classes).astype(np.float64, copy=False) -> arr = check_layout(x, name, n_classes=n_classes).astype(None, copy=False)':  # noqa: E501 - a key is one source line
        _V_FLOAT64,
    'cord_ops/validation.py::check_scores::arr = check_layout(x, name, n_classes=n_classes).astype(np.float64, copy=False) -> arr = check_layout(x, name, n_classes=n_classes).astype(np.float64, copy=None)':  # noqa: E501 - a key is one source line
        _V_COPY_NONE,
    'cord_ops/validation.py::_one_column_values::column = arr.astype(np.float64, copy=False) -> column = arr.astype(None, copy=False)':  # noqa: E501 - a key is one source line
        _V_FLOAT64,
    'cord_ops/validation.py::_one_column_values::column = arr.astype(np.float64, copy=False) -> column = arr.astype(np.float64, copy=None)':  # noqa: E501 - a key is one source line
        _V_COLUMN_COPY,
    'cord_ops/validation.py::_one_column_values::column = arr.astype(np.float64, copy=False) -> column = arr.astype(np.float64, )':  # noqa: E501 - a key is one source line
        _V_COLUMN_COPY,
    'cord_ops/validation.py::_one_column_values::column = arr.astype(np.float64, copy=False) -> column = arr.astype(np.float64, copy=True)':  # noqa: E501 - a key is one source line
        _V_COLUMN_COPY,
    'cord_ops/validation.py::check_class_labels::return classes, codes.reshape(-1).astype(np.int64) -> return classes, codes.reshape(None).astype(np.int64)':  # noqa: E501 - a key is one source line
        _V_RESHAPE,
    'cord_ops/validation.py::_column::return _one_column_values(arr[:, 0] if arr.ndim == 2 else arr, name) -> return _one_column_values(arr[:, 0] if arr.ndim == 3 else arr, name)':  # noqa: E501 - a key is one source line
        _V_TWO_COLUMNS,
    # flows/serve/contract.py
    'flows/serve/contract.py::_reason::if arr.ndim not in (1, 2) or arr.shape[0] == 0 or arr.dtype.kind not in "iuf" or ( -> if arr.ndim not in (1, 2) or arr.shape[0] == 0 or arr.dtype.kind not in "XXiufXX" or (':  # noqa: E501 - a key is one source line
        _C_KINDS,
    'flows/serve/contract.py::_as_array::if isinstance(value, np.ndarray) and value.dtype.kind in "iuf": -> if isinstance(value, np.ndarray) and value.dtype.kind in "XXiufXX":':  # noqa: E501 - a key is one source line
        _C_KINDS,
    'flows/serve/contract.py::_frame_array::if frame.shape[1] == 1 and frame.dtypes.iloc[0].kind not in "iuf": -> if frame.shape[1] == 1 and frame.dtypes.iloc[0].kind not in "XXiufXX":':  # noqa: E501 - a key is one source line
        _C_KINDS,
    'flows/serve/contract.py::_frame_array::if dtype.kind not in "iuf": -> if dtype.kind not in "XXiufXX":':  # noqa: E501 - a key is one source line
        _C_KINDS,
    'flows/serve/contract.py::_list_array::if arr is not None and arr.dtype.kind in "iuf": -> if arr is not None and arr.dtype.kind in "XXiufXX":':  # noqa: E501 - a key is one source line
        _C_KINDS,
    'flows/serve/contract.py::_list_array::if arr is not None and arr.dtype.kind in "USb": -> if arr is not None and arr.dtype.kind in "XXUSbXX":':  # noqa: E501 - a key is one source line
        _C_KINDS,
    # survivors found equivalent on a second reading
    'flows/serve/contract.py::_frame_array::if frame.shape[1] == 1 and frame.dtypes.iloc[0].kind not in "iuf": -> if frame.shape[1] == 1 and frame.dtypes.iloc[0].kind not in "IUF":':  # noqa: E501 - a key is one source line
        _C_ONE_COLUMN_FRAME,
    'flows/serve/contract.py::_list_array::rows = list(value) if not np.isscalar(value) and value is not None else None -> rows = list(value) if not np.isscalar(None) and value is not None else None':  # noqa: E501 - a key is one source line
        _C_ONLY_NONE,
    'flows/serve/contract.py::_list_array::f"got {type(value).__name__}") -> f"got {type(None).__name__}")':  # noqa: E501 - a key is one source line
        'only None reaches this message (see the line above it): type(value) is type(None)',
    'cord_ops/validation.py::check_class_labels::return classes, codes.reshape(-1).astype(np.int64) -> return classes, codes.reshape(-2).astype(np.int64)':  # noqa: E501 - a key is one source line
        'numpy (2.4) reads any negative size as the one unknown dimension: reshape(-2) is '
        'reshape(-1)',
    # onnx_export/repair.py: the float32 skip of c1 is an optimisation of a product by 1
    "onnx_export/repair.py::build_repair::unit_c1 = gb.dtype == np.float32 -> "
    "unit_c1 = None":
        "always multiplying by c1: in float32 c1 is 1.0 exactly (1 - 1e-10 rounds to 1), so "
        "the product is the identity, and in float64 the original multiplies too",
    "onnx_export/repair.py::build_repair::return t if unit_c1 else gb.mul(c1, t) -> "
    "return t if (unit_c1) and False else gb.mul(c1, t)":
        "as above: multiplying by a float32 c1 of exactly 1.0",
    'onnx_export/repair.py::interior_response::gb.const(np.finfo(gb.dtype).tiny), hint="hypot_scale") -> gb.const(np.finfo(None).tiny), hint="hypot_scale")':  # noqa: E501 - a key is one source line
        'the floor only matters when x = y = 0, and this branch runs only for |eta| >= 1e15, '
        'where |x| >= |eta| - 1 > 0: any floor (or none) gives the same scale',
    'onnx_export/repair.py::interior_response::if eta <= 1.0: -> if eta < 1.0:':  # noqa: E501 - a key is one source line
        'at eta = 1 both closed forms are sqrt(g) (eqs. 19 and 20 coincide; asserted to 2e-16 '
        'by tests/onnx/test_repair_graph.py), so which branch takes eta = 1 is not observable',
    'onnx_export/repair.py::interior_response::if abs(eta) < UNSCALED_HYPOT_BELOW_ETA: -> if abs(eta) <= UNSCALED_HYPOT_BELOW_ETA:':  # noqa: E501 - a key is one source line
        'at |eta| = 1e15 exactly both forms of R are exact to rounding (x^2 = 1e30 does not '
        'overflow even in float32)',
    'onnx_export/repair.py::interior_response::scale = gb.op("Max", gb.op("Abs", x), gb.op("Abs", y), | gb.const(np.finfo(gb.dtype).tiny), hint="hypot_scale") -> scale = gb.op("Max", gb.op("Abs", x), gb.const(np.finfo(gb.dtype).tiny), hint="hypot_scale")':  # noqa: E501 - a key is one source line
        'in this branch |x| >= |eta| - 1 >= 1e15 - 1 while |y| <= 1, so max(|x|, |y|, tiny) is '
        '|x| without |y|',
    'onnx_export/repair.py::interior_response::gb.const(np.finfo(gb.dtype).tiny), hint="hypot_scale") -> hint="hypot_scale")':  # noqa: E501 - a key is one source line
        "as for the floor's other mutants: max(|x|, |y|) > 0 here without it",
    # flows/promotion/rules.py and champion.py
    'flows/promotion/rules.py::tv_distance::p = np.asarray(p_counts, dtype=np.float64) -> p = np.asarray(p_counts, dtype=None)':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::tv_distance::p = np.asarray(p_counts, dtype=np.float64) -> p = np.asarray(p_counts, )':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::tv_distance::q = np.asarray(q_counts, dtype=np.float64) -> q = np.asarray(q_counts, dtype=None)':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::tv_distance::q = np.asarray(q_counts, dtype=np.float64) -> q = np.asarray(q_counts, )':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::sampling_tv::p = np.asarray(p_counts, dtype=np.float64) -> p = np.asarray(p_counts, dtype=None)':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::sampling_tv::p = np.asarray(p_counts, dtype=np.float64) -> p = np.asarray(p_counts, )':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::sampling_tv::q = np.asarray(q_counts, dtype=np.float64) -> q = np.asarray(q_counts, dtype=None)':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/rules.py::sampling_tv::q = np.asarray(q_counts, dtype=np.float64) -> q = np.asarray(q_counts, )':  # noqa: E501 - a key is one source line
        _RULES_COUNTS,
    'flows/promotion/champion.py::champion_timeline::if unconfirmed and timeline and timeline[-1] != before: -> if unconfirmed or timeline and timeline[-1] != before:':  # noqa: E501 - a key is one source line
        _CHAMPION_TIMELINE,
    'flows/promotion/champion.py::champion_timeline::unconfirmed = False # the last entry came from a row no later row confirmed yet -> unconfirmed = None # the last entry came from a row no later row confirmed yet':  # noqa: E501 - a key is one source line
        _CHAMPION_TIMELINE,
    'flows/promotion/champion.py::champion_timeline::unconfirmed = False # the last entry came from a row no later row confirmed yet -> unconfirmed = True # the last entry came from a row no later row confirmed yet':  # noqa: E501 - a key is one source line
        _CHAMPION_TIMELINE,
    'flows/promotion/champion.py::score_champion::repaired = np.asarray(outputs["repaired"], dtype=np.float64) -> repaired = np.asarray(outputs["repaired"], dtype=None)':  # noqa: E501 - a key is one source line
        _CHAMPION_REPAIRED,
    'flows/promotion/champion.py::score_champion::repaired = np.asarray(outputs["repaired"], dtype=np.float64) -> repaired = np.asarray(outputs["repaired"], )':  # noqa: E501 - a key is one source line
        _CHAMPION_REPAIRED,
    # flows/store/journal.py
    'flows/store/journal.py::record::error: OSError | None = None -> error: OSError | None = ""':
        "folders() is never empty, so error is always reassigned before the raise",
    # flows/store/owner.py
    "flows/store/owner.py::terminate_group::time.sleep(0.05) -> time.sleep(1.05)":
        "poll interval: only how soon a group that obeyed SIGTERM is noticed (latency, "
        "which a test on a loaded machine cannot pin without flaking)",
    "flows/store/owner.py::terminate_group::with contextlib.suppress(ProcessLookupError): -> "
    "with contextlib.suppress(None):":
        "the second suppress (before SIGKILL) only matters if the group ends between the "
        "last poll and the kill: a race no test can force (the first one is tested)",
    "flows/store/owner.py::terminate_group::while time.monotonic() < deadline: -> "
    "while time.monotonic() <= deadline:":
        "the clock equals the deadline to the nanosecond: no observable difference",
    "flows/store/owner.py::Heartbeat.__exit__::self._thread.join(timeout=5) -> "
    "self._thread.join(timeout=None)":
        "differs only when a set_tag call hangs for more than 5 s (a daemon thread either way)",
    "flows/store/owner.py::Heartbeat.__exit__::self._thread.join(timeout=5) -> "
    "self._thread.join(timeout=6)":
        "differs only when a set_tag call hangs for more than 5 s",
    "flows/store/owner.py::Owner.process_alive::"
    "return abs(psutil.Process(self.pid).create_time() - self.started) < 0.01 -> "
    "return abs(psutil.Process(self.pid).create_time() - self.started) <= 0.01":
        "start times that differ by exactly 10 ms: no float pair a test can construct "
        "against a real process's create_time",
    'flows/store/owner.py::process_stamp::return None if started is None else f"epoch:{started!r}" -> return None if (started is None) and False else f"epoch:{started!r}"':  # noqa: E501 - a key is one source line
        "started is None there only when the process ends between the liveness check two "
        "lines up and this one (a race no test can force); the 'epoch:None' stamp then "
        "matches no live process either",
    "flows/store/owner.py::Owner.process_alive::return True -> return False":
        "AccessDenied needs another user's process; the tests run as root, where psutil "
        "never denies (not equivalent: untestable here)",
    # flows/store/registry.py
    'flows/store/registry.py::withdraw_version::holder = None -> holder = ""':
        'a version number is never "", so "" and None both differ from str(version)',
    # flows/store/lock.py
    "flows/store/lock.py::_hold_file_lock::lock = FileLock(lock_file, thread_local=False) "
    "-> lock = FileLock(lock_file, thread_local=None)":
        "filelock only tests the flag's truth (None and False both pick the shared context)",
    "flows/store/lock.py::_hold_file_lock::lock.acquire(timeout=seconds, poll_interval=0.05)"
    " -> lock.acquire(timeout=seconds, poll_interval=None)":
        "None means the instance's poll interval, which is filelock's default 0.05",
    "flows/store/lock.py::_hold_file_lock::lock.acquire(timeout=seconds, poll_interval=0.05)"
    " -> lock.acquire(timeout=seconds, )":
        "the argument left out is the instance's poll interval, filelock's default 0.05",
    "flows/store/lock.py::_hold_file_lock::lock.acquire(timeout=seconds, poll_interval=0.05)"
    " -> lock.acquire(timeout=seconds, poll_interval=1.05)":
        "poll interval: only how soon a released lock is noticed (latency, which a test on a "
        "loaded machine cannot pin without flaking; not equivalent)",
    "flows/store/lock.py::_hold_lease::renewer.join(timeout=5) -> "
    "renewer.join(timeout=None)":
        "differs only when a renewal's tag call hangs for more than 5 s (a daemon thread "
        "either way)",
    "flows/store/lock.py::_hold_lease::renewer.join(timeout=5) -> renewer.join(timeout=6)":
        "differs only when a renewal's tag call hangs for more than 5 s",
    "flows/store/lock.py::_hold_prefect_slot::slot = concurrency(name, occupy=1, "
    "timeout_seconds=seconds or timeout, -> slot = concurrency(name, "
    "timeout_seconds=seconds or timeout,":
        "occupy=1 is prefect.concurrency.sync.concurrency's default",
    'flows/store/lock.py::_lease_free::if float(lease.get("expires", 0)) <= now: -> '
    'if float(lease.get("expires", 1)) <= now:':
        "a lease without an expiry is expired at any time.time() from 1 s after the epoch on; "
        "the two defaults differ only for a clock before 1970-01-01 00:00:01",
    # cord_ops/reduce.py and cord_ops/partition_sums.py; their einsum subscripts
    # upper-cased are ACCEPTED_RULES
    'cord_ops/reduce.py::_two_loop::for (s_k, y_k, rho), a in zip(memory, reversed(alphas), strict=True): -> for (s_k, y_k, rho), a in zip(memory, reversed(alphas), strict=None):':  # noqa: E501 - a key is one source line
        _R_STRICT,
    'cord_ops/reduce.py::_two_loop::for (s_k, y_k, rho), a in zip(memory, reversed(alphas), strict=True): -> for (s_k, y_k, rho), a in zip(memory, reversed(alphas), ):':  # noqa: E501 - a key is one source line
        _R_STRICT,
    'cord_ops/reduce.py::_two_loop::for (s_k, y_k, rho), a in zip(memory, reversed(alphas), strict=True): -> for (s_k, y_k, rho), a in zip(memory, reversed(alphas), strict=False):':  # noqa: E501 - a key is one source line
        _R_STRICT,
    'cord_ops/reduce.py::calibrator_state::make_calibrator(name, input_kind=input_kind).get_params().items() -> make_calibrator(name, ).get_params().items()':  # noqa: E501 - a key is one source line
        _R_OPTIONS,
    'cord_ops/reduce.py::fit_temperature::cal = make_calibrator("ts", input_kind=input_kind, max_iter=max_iter) -> cal = make_calibrator("ts", max_iter=max_iter)':  # noqa: E501 - a key is one source line
        _R_FLOOR,
    'cord_ops/reduce.py::fit_temperature::cal = make_calibrator("ts", input_kind=input_kind, max_iter=max_iter) -> cal = make_calibrator("ts", input_kind=input_kind, )':  # noqa: E501 - a key is one source line
        _R_TS_CAL,
    'cord_ops/reduce.py::fit_temperature::max_iter=max_iter, name="ts"))}, floor -> max_iter=max_iter, ))}, floor':  # noqa: E501 - a key is one source line
        _R_TS_NAME,
    'cord_ops/reduce.py::fit_vector::cal = make_calibrator("vs", input_kind=input_kind) -> cal = make_calibrator("vs", )':  # noqa: E501 - a key is one source line
        _R_FLOOR,
    'cord_ops/reduce.py::fit_vector::theta, factor = _vs_start(sample, k, input_kind, floor, gtol) -> theta, factor = _vs_start(sample, None, input_kind, floor, gtol)':  # noqa: E501 - a key is one source line
        _R_START_K,
    'cord_ops/reduce.py::_ReducedMean.at_least::return self.exact(eta) >= mu if estimate is None else estimate > mu -> return self.exact(eta) >= mu if estimate is None else estimate >= mu':  # noqa: E501 - a key is one source line
        _R_NEVER_EQUAL,
    'cord_ops/partition_sums.py::_row_metric_sums::bins = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1) -> bins = np.clip(np.searchsorted(edges, conf, ) - 1, 0, n_bins - 1)':  # noqa: E501 - a key is one source line
        _M_SIDE,
    'cord_ops/partition_sums.py::_row_metric_sums::"acc": np.bincount(bins, weights=correct.astype(np.float64), -> "acc": np.bincount(bins, weights=correct.astype(None),':  # noqa: E501 - a key is one source line
        _M_DTYPE,
    'cord_ops/reduce.py::_ReducedMean._screened::self.screening = False -> self.screening = None':  # noqa: E501 - a key is one source line
        _R_SCREEN_OFF,
    'cord_ops/reduce.py::_ReducedMean.at_most::return self.exact(eta) <= mu if estimate is None else estimate < mu -> return self.exact(eta) <= mu if estimate is None else estimate <= mu':  # noqa: E501 - a key is one source line
        _R_NEVER_EQUAL,
    'cord_ops/partition_sums.py::exact_sum::if big >= 2.0**960: # C would overflow; never the case for probabilities and NLLs -> if big > 2.0**960: # C would overflow; never the case for probabilities and NLLs':  # noqa: E501 - a key is one source line
        _P_FRACTION_PATH,
    'cord_ops/partition_sums.py::exact_sum::if big >= 2.0**960: # C would overflow; never the case for probabilities and NLLs -> if big >= 2.0 * 960: # C would overflow; never the case for probabilities and NLLs':  # noqa: E501 - a key is one source line
        _P_FRACTION_PATH,
    'cord_ops/partition_sums.py::exact_sum::if big >= 2.0**960: # C would overflow; never the case for probabilities and NLLs -> if big >= 2.0**961: # C would overflow; never the case for probabilities and NLLs':  # noqa: E501 - a key is one source line
        _P_FRACTION_PATH,
    'cord_ops/partition_sums.py::exact_sum::big = float(np.max(np.abs(rest))) if rest.size else 0.0 -> big = float(np.max(np.abs(rest))) if (rest.size) or True else 0.0':  # noqa: E501 - a key is one source line
        _P_EMPTY,
    'cord_ops/partition_sums.py::exact_sum::big = float(np.max(np.abs(rest))) if rest.size else 0.0 -> big = float(np.max(np.abs(rest))) if rest.size else 1.0':  # noqa: E501 - a key is one source line
        _P_EMPTY,
    'cord_ops/partition_sums.py::exact_sum::scale = max(bound - 31, -_SCALE) -> scale = max(bound - 32, -_SCALE)':  # noqa: E501 - a key is one source line
        _P_LIMBS,
    'cord_ops/partition_sums.py::exact_sum::bound = scale - 1 -> bound = scale - 2':  # noqa: E501 - a key is one source line
        _P_LIMBS,
    'cord_ops/partition_sums.py::exact_sum::bound = scale - 1 -> bound = scale + 1':  # noqa: E501 - a key is one source line
        _P_LIMBS,
    'cord_ops/partition_sums.py::exact_sum::if scale == -_SCALE or not rest.any(): -> if scale == -_SCALE and not rest.any():':  # noqa: E501 - a key is one source line
        _P_LOOP_END,
    'cord_ops/partition_sums.py::exact_sum::if scale == -_SCALE or not rest.any(): -> if scale == +_SCALE or not rest.any():':  # noqa: E501 - a key is one source line
        _P_LOOP_END,
    'cord_ops/partition_sums.py::cord_multiplier_range::upper = np.full_like(g, 1.0 - EPS_NUM) -> upper = np.full_like(None, 1.0 - EPS_NUM)':  # noqa: E501 - a key is one source line
        _P_UPPER_ARRAY,
    'cord_ops/partition_sums.py::cord_response_estimate::s = 2.0 * g / ((1.0 - eta) + r) if eta <= 1.0 else ((eta - 1.0) + r) / (2.0 * eta) -> s = 2.0 * g / ((1.0 - eta) + r) if eta < 1.0 else ((eta - 1.0) + r) / (2.0 * eta)':  # noqa: E501 - a key is one source line
        _P_ETA_ONE,
    'flows/promotion/guards.py::harm_words::reason = tags.get(REASON_TAG) or "" -> reason = tags.get(REASON_TAG) or "XXXX"':  # noqa: E501 - a key is one source line
        "the default only stands for a missing reason, whose parts are then searched for "
        "one starting 'does harm': neither '' nor 'XXXX' has one, so the words are the same",
    # flows/platform/warm_access.py
    "flows/platform/warm_access.py::command_of::sink = io.StringIO() -> sink = None":
        _ARGPARSE_SILENT,
    "flows/platform/warm_access.py::command_of::with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink): -> with contextlib.redirect_stdout(None), contextlib.redirect_stderr(sink):":  # noqa: E501 - a key is one source line
        _ARGPARSE_SILENT,
    "flows/platform/warm_access.py::command_of::with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink): -> with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(None):":  # noqa: E501 - a key is one source line
        _ARGPARSE_SILENT,
    # flows/serve/access.py
    'flows/serve/access.py::_host_name::return host.rsplit(":", 1)[0] if host.count(":") == 1 else host -> return host.rsplit(":", )[0] if host.count(":") == 1 else host':  # noqa: E501 - a key is one source line
        _ONE_COLON,
    'flows/serve/access.py::_host_name::return host.rsplit(":", 1)[0] if host.count(":") == 1 else host -> return host.split(":", 1)[0] if host.count(":") == 1 else host':  # noqa: E501 - a key is one source line
        _ONE_COLON,
    'flows/serve/access.py::_host_name::return host.rsplit(":", 1)[0] if host.count(":") == 1 else host -> return host.rsplit(":", 2)[0] if host.count(":") == 1 else host':  # noqa: E501 - a key is one source line
        _ONE_COLON,
    'flows/serve/access.py::resolve::token = secrets.token_urlsafe(32) -> token = secrets.token_urlsafe(None)':  # noqa: E501 - a key is one source line
        "secrets' default entropy is 32 bytes: the same 43-character token",
    'flows/serve/access.py::Access.local::return cls(token=token or secrets.token_urlsafe(32), hosts=frozenset(hosts), -> return cls(token=token or secrets.token_urlsafe(None), hosts=frozenset(hosts),':  # noqa: E501 - a key is one source line
        "secrets' default entropy is 32 bytes: the same 43-character token",
    'flows/serve/access.py::Access.authorized::scheme, _, given = (authorization or "").partition(" ") -> scheme, _, given = (authorization or "XXXX").partition(" ")':  # noqa: E501 - a key is one source line
        "no header: scheme \"\" or \"XXXX\", neither is bearer, refused either way",
    'flows/serve/access.py::Access.host_refusal::name = _host_name(host.decode("latin-1")) -> name = _host_name(host.decode("LATIN-1"))':  # noqa: E501 - a key is one source line
        "codec names are case-insensitive",
    'flows/serve/access.py::Access.local::hosts = set(LOCAL_HOSTS) | {h.strip().lower().strip("[]") for h in allowed_hosts -> hosts = set(LOCAL_HOSTS) | {h.strip().lower().strip("XX[]XX") for h in allowed_hosts':  # noqa: E501 - a key is one source line
        "the name is lowercased first: no \"X\" is left to strip",
    'flows/serve/access.py::Access.post_refusal::media = headers.get("content-type", "").split(";")[0].strip().lower() -> media = headers.get("CONTENT-TYPE", "").split(";")[0].strip().lower()':  # noqa: E501 - a key is one source line
        _HEADERS_ANY_CASE,
    'flows/serve/access.py::Access.post_refusal::if token and not self.authorized(headers.get("authorization")): -> if token and not self.authorized(headers.get("AUTHORIZATION")):':  # noqa: E501 - a key is one source line
        _HEADERS_ANY_CASE,
    # flows/platform/credential.py
    'flows/platform/credential.py::new::return f"{USER}:{secrets.token_urlsafe(32)}" -> return f"{USER}:{secrets.token_urlsafe(None)}"':  # noqa: E501 - a key is one source line
        "secrets' default entropy is 32 bytes: the same 43-character password",
    "flows/platform/credential.py::private_folder::folder.mkdir(mode=0o700) -> folder.mkdir(mode=449)":  # noqa: E501 - a key is one source line
        "0o701; the folder is chmod 0700 on the next lines, so only the instant between "
        "mkdir and chmod differs, when the new folder is empty and others could enter but "
        "not list it",
    "flows/platform/credential.py::write_private::tmp.unlink(missing_ok=True) -> tmp.unlink(missing_ok=None)":  # noqa: E501 - a key is one source line
        _TMP_EXISTS,
    "flows/platform/credential.py::write_private::tmp.unlink(missing_ok=True) -> tmp.unlink(missing_ok=False)":  # noqa: E501 - a key is one source line
        _TMP_EXISTS,
    'flows/platform/credential.py::write_private::tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp") -> tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(None)}.tmp")':  # noqa: E501 - a key is one source line
        _TMP_SUFFIX,
    'flows/platform/credential.py::write_private::tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp") -> tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(5)}.tmp")':  # noqa: E501 - a key is one source line
        _TMP_SUFFIX,
    # flows/store/graphs.py
    'flows/store/graphs.py::_model_file::if any(f.path.rsplit("/", 1)[-1] == leaf for f in listed or ()): -> if any(f.path.rsplit("/", )[-1] == leaf for f in listed or ()):':  # noqa: E501 - a key is one source line
        _G_LISTED,
    'flows/store/graphs.py::_model_file::if any(f.path.rsplit("/", 1)[-1] == leaf for f in listed or ()): -> if any(f.path.split("/", 1)[-1] == leaf for f in listed or ()):':  # noqa: E501 - a key is one source line
        _G_LISTED,
    'flows/store/graphs.py::_model_file::if any(f.path.rsplit("/", 1)[-1] == leaf for f in listed or ()): -> if any(f.path.rsplit("/", 2)[-1] == leaf for f in listed or ()):':  # noqa: E501 - a key is one source line
        _G_LISTED,
    'flows/store/graphs.py::_model_file::if any(f.path.rsplit("/", 1)[-1] == leaf for f in listed or ()): -> if any(f.path.rsplit("/", 1)[+1] == leaf for f in listed or ()):':  # noqa: E501 - a key is one source line
        _G_LISTED,
    'flows/store/graphs.py::load_graph::with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as tmp: -> with tempfile.TemporaryDirectory(prefix=None) as tmp:':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::load_graph::with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as tmp: -> with tempfile.TemporaryDirectory(prefix="XXcord-ops-model-XX") as tmp:':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::load_graph::with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as tmp: -> with tempfile.TemporaryDirectory(prefix="CORD-OPS-MODEL-") as tmp:':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::record_digests::model_dir = tracking.download(uri, model_uri, folder / "model") -> model_dir = tracking.download(uri, model_uri, folder / "XXmodelXX")':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::record_digests::model_dir = tracking.download(uri, model_uri, folder / "model") -> model_dir = tracking.download(uri, model_uri, folder / "MODEL")':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::record_digests::back = tracking.download_from_run(uri, run_id, DIGESTS_ARTIFACT, folder / "back") -> back = tracking.download_from_run(uri, run_id, DIGESTS_ARTIFACT, folder / "XXbackXX")':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::record_digests::back = tracking.download_from_run(uri, run_id, DIGESTS_ARTIFACT, folder / "back") -> back = tracking.download_from_run(uri, run_id, DIGESTS_ARTIFACT, folder / "BACK")':  # noqa: E501 - a key is one source line
        _G_SCRATCH,
    'flows/store/graphs.py::record_digests::payload = (json.dumps(manifest, indent=2, sort_keys=True) + "\\n").encode() -> payload = (json.dumps(manifest, indent=None, sort_keys=True) + "\\n").encode()':  # noqa: E501 - a key is one source line
        _G_LAYOUT,
    'flows/store/graphs.py::record_digests::payload = (json.dumps(manifest, indent=2, sort_keys=True) + "\\n").encode() -> payload = (json.dumps(manifest, sort_keys=True) + "\\n").encode()':  # noqa: E501 - a key is one source line
        _G_LAYOUT,
    'flows/store/graphs.py::record_digests::payload = (json.dumps(manifest, indent=2, sort_keys=True) + "\\n").encode() -> payload = (json.dumps(manifest, indent=3, sort_keys=True) + "\\n").encode()':  # noqa: E501 - a key is one source line
        _G_LAYOUT,
    "flows/store/graphs.py::recorded_digests::client.tracking_uri, f\"{run.info.artifact_uri.rstrip('/')}/{DIGESTS_ARTIFACT}\", folder) -> client.tracking_uri, f\"{run.info.artifact_uri.rstrip(None)}/{DIGESTS_ARTIFACT}\", folder)":  # noqa: E501 - a key is one source line
        _G_RUN_URI,
    "flows/store/graphs.py::recorded_digests::client.tracking_uri, f\"{run.info.artifact_uri.rstrip('/')}/{DIGESTS_ARTIFACT}\", folder) -> client.tracking_uri, f\"{run.info.artifact_uri.rstrip('XX/XX')}/{DIGESTS_ARTIFACT}\", folder)":  # noqa: E501 - a key is one source line
        _G_RUN_URI,
    'flows/store/graphs.py::run_graph::session = open_session(graph, provider="cpu", spin=False) -> session = open_session(graph, provider="cpu", spin=None)':  # noqa: E501 - a key is one source line
        _G_SPIN,
    'flows/store/graphs.py::sha256_file::for block in iter(lambda: handle.read(1 << 20), b""): -> for block in iter(lambda: handle.read(None), b""):':  # noqa: E501 - a key is one source line
        _G_CHUNK,
    'flows/store/graphs.py::sha256_file::for block in iter(lambda: handle.read(1 << 20), b""): -> for block in iter(lambda: handle.read(2 << 20), b""):':  # noqa: E501 - a key is one source line
        _G_CHUNK,
    'flows/store/graphs.py::sha256_file::for block in iter(lambda: handle.read(1 << 20), b""): -> for block in iter(lambda: handle.read(1 << 21), b""):':  # noqa: E501 - a key is one source line
        _G_CHUNK,
    # cord_ops/label_free.py
    'cord_ops/label_free.py::_isotonic::return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, -> return IsotonicRegression(y_min=None, y_max=1.0, increasing=True,':  # noqa: E501 - a key is one source line
        _LF_BOUNDS,
    'cord_ops/label_free.py::_isotonic::return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, -> return IsotonicRegression(y_min=0.0, y_max=None, increasing=True,':  # noqa: E501 - a key is one source line
        _LF_BOUNDS,
    'cord_ops/label_free.py::_isotonic::return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, -> return IsotonicRegression(y_max=1.0, increasing=True,':  # noqa: E501 - a key is one source line
        _LF_BOUNDS,
    'cord_ops/label_free.py::_isotonic::return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, -> return IsotonicRegression(y_min=0.0, increasing=True,':  # noqa: E501 - a key is one source line
        _LF_BOUNDS,
    'cord_ops/label_free.py::_isotonic::return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, | out_of_bounds="clip").fit(confidence, correct) -> return IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(confidence, correct)':  # noqa: E501 - a key is one source line
        _LF_INCREASING,
    'cord_ops/label_free.py::_isotonic::return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, -> return IsotonicRegression(y_min=0.0, y_max=2.0, increasing=True,':  # noqa: E501 - a key is one source line
        _LF_BOUNDS,
    'cord_ops/label_free.py::ConfidenceMaps.fit::right = np.asarray(correct, dtype=np.float64) -> right = np.asarray(correct, dtype=None)':  # noqa: E501 - a key is one source line
        _LF_RIGHT,
    'cord_ops/label_free.py::ConfidenceMaps.fit::right = np.asarray(correct, dtype=np.float64) -> right = np.asarray(correct, )':  # noqa: E501 - a key is one source line
        _LF_RIGHT,
    'cord_ops/label_free.py::OneVsRestMaps.fit::labels = np.asarray(labels, dtype=np.int64) -> labels = np.asarray(labels, dtype=None)':  # noqa: E501 - a key is one source line
        _LF_LABELS,
    'cord_ops/label_free.py::OneVsRestMaps.fit::labels = np.asarray(labels, dtype=np.int64) -> labels = np.asarray(labels, )':  # noqa: E501 - a key is one source line
        _LF_LABELS,
    'cord_ops/label_free.py::OneVsRestMaps.fit::self.maps_ = [_isotonic(scores[:, k], (labels == k).astype(np.float64)) -> self.maps_ = [_isotonic(scores[:, k], (labels == k).astype(None))':  # noqa: E501 - a key is one source line
        _LF_ASTYPE_NONE,
    'cord_ops/label_free.py::atc_threshold::conf = np.asarray(confidence, dtype=np.float64) -> conf = np.asarray(confidence, dtype=None)':  # noqa: E501 - a key is one source line
        _LF_ATC_ORDER,
    'cord_ops/label_free.py::atc_threshold::conf = np.asarray(confidence, dtype=np.float64) -> conf = np.asarray(confidence, )':  # noqa: E501 - a key is one source line
        _LF_ATC_ORDER,
    'cord_ops/label_free.py::atc_threshold::return float("inf") -> return float("INF")':  # noqa: E501 - a key is one source line
        _LF_INF,
    'cord_ops/label_free.py::check_priors::or abs(pi.sum() - 1.0) > 1e-6: -> or abs(pi.sum() - 1.0) >= 1e-6:':  # noqa: E501 - a key is one source line
        _LF_SUM_BOUND,
    'cord_ops/label_free.py::prior_weights::source = np.asarray(source_priors, dtype=np.float64) -> source = np.asarray(source_priors, dtype=None)':  # noqa: E501 - a key is one source line
        _LF_SOURCE,
    'cord_ops/label_free.py::prior_weights::source = np.asarray(source_priors, dtype=np.float64) -> source = np.asarray(source_priors, )':  # noqa: E501 - a key is one source line
        _LF_SOURCE,
    'cord_ops/label_free.py::reweighted::if np.all(weights == weights[0]) and weights[0] > 0: -> if np.all(weights == weights[0]) and weights[0] >= 0:':  # noqa: E501 - a key is one source line
        _LF_ALL_ZERO,
    'cord_ops/label_free.py::label_shares::source = np.asarray(source_priors, dtype=np.float64) -> source = np.asarray(source_priors, dtype=None)':  # noqa: E501 - a key is one source line
        _LF_SOURCE,
    'cord_ops/label_free.py::label_shares::source = np.asarray(source_priors, dtype=np.float64) -> source = np.asarray(source_priors, )':  # noqa: E501 - a key is one source line
        _LF_SOURCE,
    'cord_ops/label_free.py::label_shares::shares = np.asarray(label_counts, dtype=np.float64) * np.divide( -> shares = np.asarray(label_counts, dtype=None) * np.divide(':  # noqa: E501 - a key is one source line
        _LF_COUNTS,
    'cord_ops/label_free.py::label_shares::shares = np.asarray(label_counts, dtype=np.float64) * np.divide( -> shares = np.asarray(label_counts, ) * np.divide(':  # noqa: E501 - a key is one source line
        _LF_COUNTS,
    'cord_ops/label_free.py::reweighted_accuracy::@ np.asarray(class_accuracy, dtype=np.float64)) -> @ np.asarray(class_accuracy, dtype=None))':  # noqa: E501 - a key is one source line
        _LF_MATMUL,
    'cord_ops/label_free.py::reweighted_accuracy::@ np.asarray(class_accuracy, dtype=np.float64)) -> @ np.asarray(class_accuracy, ))':  # noqa: E501 - a key is one source line
        _LF_MATMUL,
    'cord_ops/label_free.py::ks_confidence::result = ks_2samp(np.asarray(reference_confidence, dtype=np.float64), -> result = ks_2samp(np.asarray(reference_confidence, dtype=None),':  # noqa: E501 - a key is one source line
        _LF_KS,
    'cord_ops/label_free.py::ks_confidence::result = ks_2samp(np.asarray(reference_confidence, dtype=np.float64), -> result = ks_2samp(np.asarray(reference_confidence, ),':  # noqa: E501 - a key is one source line
        _LF_KS,
    'cord_ops/label_free.py::ks_confidence::np.asarray(confidence, dtype=np.float64)) -> np.asarray(confidence, dtype=None))':  # noqa: E501 - a key is one source line
        _LF_KS,
    'cord_ops/label_free.py::ks_confidence::np.asarray(confidence, dtype=np.float64)) -> np.asarray(confidence, ))':  # noqa: E501 - a key is one source line
        _LF_KS,
    'cord_ops/label_free.py::chi2_predicted::table = np.vstack([np.asarray(reference_counts, dtype=np.float64), -> table = np.vstack([np.asarray(reference_counts, dtype=None),':  # noqa: E501 - a key is one source line
        _LF_CHI2,
    'cord_ops/label_free.py::chi2_predicted::table = np.vstack([np.asarray(reference_counts, dtype=np.float64), -> table = np.vstack([np.asarray(reference_counts, ),':  # noqa: E501 - a key is one source line
        _LF_CHI2,
    'cord_ops/label_free.py::chi2_predicted::np.asarray(counts, dtype=np.float64)]) -> np.asarray(counts, dtype=None)])':  # noqa: E501 - a key is one source line
        _LF_CHI2,
    'cord_ops/label_free.py::chi2_predicted::np.asarray(counts, dtype=np.float64)]) -> np.asarray(counts, )])':  # noqa: E501 - a key is one source line
        _LF_CHI2,
    'cord_ops/label_free.py::chi2_predicted::result = chi2_contingency(table, correction=False) -> result = chi2_contingency(table, correction=None)':  # noqa: E501 - a key is one source line
        _LF_YATES,
    'cord_ops/label_free.py::total_variation::return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64) -> return 0.5 * float(np.abs(np.asarray(p, dtype=None)':  # noqa: E501 - a key is one source line
        _LF_TV,
    'cord_ops/label_free.py::total_variation::return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64) -> return 0.5 * float(np.abs(np.asarray(p, )':  # noqa: E501 - a key is one source line
        _LF_TV,
    'cord_ops/label_free.py::total_variation::- np.asarray(q, dtype=np.float64)).sum()) -> - np.asarray(q, dtype=None)).sum())':  # noqa: E501 - a key is one source line
        _LF_TV,
    'cord_ops/label_free.py::total_variation::- np.asarray(q, dtype=np.float64)).sum()) -> - np.asarray(q, )).sum())':  # noqa: E501 - a key is one source line
        _LF_TV,
    'cord_ops/label_free.py::ReferenceProfile._fit_maps::predicted, self._reads(recipe, probs, predicted, raw), correct, k) -> predicted, self._reads(None, probs, predicted, raw), correct, k)':  # noqa: E501 - a key is one source line
        _LF_READS_NONE,
    'cord_ops/label_free.py::ReferenceProfile._choose_recipe::folds = KFold(RECIPE_FOLDS, shuffle=True, random_state=0).split(probs) -> folds = KFold(shuffle=True, random_state=0).split(probs)':  # noqa: E501 - a key is one source line
        _LF_FOLDS,
    'cord_ops/label_free.py::ReferenceProfile.fit::y = check_labels(labels, n, k, "labels") -> y = check_labels(labels, n, k, )':  # noqa: E501 - a key is one source line
        _LF_LABELS_NAME,
    'cord_ops/label_free.py::ReferenceProfile.fit::self.prior_maps_ = self.maps_ if self.recipe_ == CLASS_MAPS else \\ -> self.prior_maps_ = self.maps_ if (self.recipe_ == CLASS_MAPS) and False else \\':  # noqa: E501 - a key is one source line
        _LF_REFIT,
    'cord_ops/label_free.py::ReferenceProfile.fit::self._fit_maps(CLASS_MAPS, p, y, predicted, correct, raw) -> self._fit_maps(None, p, y, predicted, correct, raw)':  # noqa: E501 - a key is one source line
        _LF_READS_NONE,
    'cord_ops/label_free.py::ReferenceProfile.fit::self._fit_maps(CLASS_MAPS, p, y, predicted, correct, raw) -> self._fit_maps(CLASS_MAPS, p, None, predicted, correct, raw)':  # noqa: E501 - a key is one source line
        _LF_FIT_LABELS,
    'cord_ops/label_free.py::ReferenceProfile.estimate::CLASS_MAPS, reweighted(p, prior_weights(self.priors_, em.priors)), predicted, -> None, reweighted(p, prior_weights(self.priors_, em.priors)), predicted,':  # noqa: E501 - a key is one source line
        _LF_READS_NONE,
    'cord_ops/label_free.py::ReferenceProfile.estimate::rows = np.maximum(self.label_counts_, 1) -> rows = np.maximum(self.label_counts_, 2)':  # noqa: E501 - a key is one source line
        _LF_ONE_ROW,
    'cord_ops/label_free.py::ReferenceProfile.estimate::route = "cbpe" if gap > tolerance else "reweighted" if known else "confidence" -> route = "cbpe" if gap >= tolerance else "reweighted" if known else "confidence"':  # noqa: E501 - a key is one source line
        _LF_GAP_EQUAL,
}

def _without_node_names(line: str) -> str:
    """A source line with its ``hint=`` arguments removed (GraphBuilder's node-name hints)."""
    line = re.sub(r"""hint=(None|"[^"]*")""", "", line)
    return re.sub(r",\s*(,|\))", r"\1", line).replace("(, ", "(")


def _einsum_upper(line: str) -> str:
    """A source line with its einsum subscripts upper-cased (mutmut's string mutation)."""
    return re.sub(r'einsum\("([^"]*)"', lambda m: f'einsum("{m.group(1).upper()}"', line)


#: Classes of survivors equivalent by construction, as (module prefix or prefixes, rule,
#: why).
ACCEPTED_RULES = [
    ("onnx_export/",
     lambda old, new: old != new and _without_node_names(old) == _without_node_names(new),
     "changes only a node's name hint: GraphBuilder.fresh turns any hint (None: the op "
     "type) into a unique tensor name, and no output's name comes from a hint"),
    (("cord_ops/reduce.py", "cord_ops/partition_sums.py"),
     lambda old, new: old != new and _einsum_upper(old) == new,
     "einsum subscripts are letters: upper case names the same axes"),
]


def accepted_reason(key: str) -> str | None:
    """Why a survivor is equivalent (``ACCEPTED`` or a rule of ``ACCEPTED_RULES``), or None."""
    if key in ACCEPTED:
        return ACCEPTED[key]
    module, _, change = key.split("::", 2)
    old, _, new = change.partition(" -> ")
    for prefix, rule, why in ACCEPTED_RULES:
        if module.startswith(prefix) and rule(old, new):
            return why
    return None


#: mutmut exit codes (mutmut.stats.status_by_exit_code) by what this script counts.
KILLED = {1, 3, 36, -24, 24, 152, 255}  # failed tests, or ran past the timeout
SURVIVED = {0}
UNTESTED = {5, 33}


def _squash(line: str) -> str:
    return re.sub(r"\s+", " ", line).strip()


def survivor_key(module: str, function: str, diff: str) -> str:
    """``module::function::old -> new`` from mutmut's unified diff of one mutant."""
    old = [_squash(x[1:]) for x in diff.splitlines() if x.startswith("-") and not
           x.startswith("---")]
    new = [_squash(x[1:]) for x in diff.splitlines() if x.startswith("+") and not
           x.startswith("+++")]
    return f"{module}::{function}::{' | '.join(old)} -> {' | '.join(new)}"


def function_of(mutant: str) -> str:
    """``cord_ops.cord_solve.x_bisect_multiplier__mutmut_3`` -> ``bisect_multiplier``;
    ``...xǁ_MeanResponseǁat_least__mutmut_1`` -> ``_MeanResponse.at_least``."""
    name = mutant.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1]
    if name.startswith("x\u01c1"):
        _, cls, method = name.split("\u01c1")
        return f"{cls}.{method}"
    return name.removeprefix("x_")


def _mutmut_section(module: str, tests: list[str]) -> str:
    args = ", ".join(json.dumps(t) for t in tests)
    return ("[tool.mutmut]\n"
            f"source_paths = {json.dumps(list(PACKAGES))}\n"
            f"only_mutate = [{json.dumps(module)}]\n"
            f"pytest_add_cli_args_test_selection = [{args}]\n"
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-m", "not slow"]\n'
            # one server process imports pytest, numpy, scipy and the test modules once and
            # forks a child per mutant; the default forks a bare process that imports them
            # all again for each mutant (a second of CPU each)
            'process_isolation = "forkserver"\n'
            'forkserver_warmup = "collect"\n'
            # mutmut stops a mutant's run after (its tests' clean time + constant) x
            # multiplier seconds of WALL time (and twice that of CPU): the default, (t + 1)
            # x 15, lets a mutant that turns a bisection into an endless loop burn minutes;
            # the larger constant keeps a loaded machine (a fork's pytest collection alone
            # takes seconds on a loaded machine) from reading slow as a timeout, i.e. as killed
            f"timeout_multiplier = {TIMEOUT_MULTIPLIER}\n"
            f"timeout_constant = {TIMEOUT_CONSTANT}\n")


def scratch_copy(module: str, tests: list[str]) -> Path:
    """A copy of the packages and tests with ``[tool.mutmut]`` set for ``module``."""
    work = Path(tempfile.mkdtemp(prefix="cord-mutation-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in (*PACKAGES, "tests"):
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    text = (ROOT / "pyproject.toml").read_text()
    text = re.sub(r"\n\[tool\.mutmut\]\n(?:[^\[].*\n|\n)*", "\n", text)
    (work / "pyproject.toml").write_text(text + "\n" + _mutmut_section(module, tests))
    return work


def collect(work: Path) -> None:
    """Run inside the scratch copy (``--collect``): print each mutant's exit code and,
    for those not killed, its diff, as JSON."""
    os.chdir(work)
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    out = {}
    for meta in Path("mutants").rglob("*.py.meta"):
        source = meta.relative_to("mutants").with_suffix("")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            diff = None if code in KILLED else get_diff_for_mutant(name, path=source)
            out[name] = {"code": code, "diff": diff}
    print(json.dumps(out))


def mlflow_template(work: Path) -> Path:
    """An MLflow sqlite store migrated once for all of a module's mutants (each mutant's
    pytest would otherwise migrate its own, for seconds; tests/flows/conftest.py copies it)."""
    db = work / "mlflow-template" / "mlflow.db"
    db.parent.mkdir()
    subprocess.run([sys.executable, "-c", "import sys; from mlflow import MlflowClient; "
                    "MlflowClient(f'sqlite:///{sys.argv[1]}').search_experiments()", str(db)],
                   check=True, capture_output=True,
                   env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    return db


def run_module(module: str, tests: list[str], max_children: int, keep: bool) -> dict:
    # entries starting with "-" are pytest options (``--deselect=NODE``), passed as they are
    missing = [t for t in tests if not t.startswith("-")
               and not (ROOT / t.split("::")[0]).exists()]
    for test in missing:  # e.g. measuring a commit from before a test file existed
        print(f"  {module}: {test} does not exist here; left out", file=sys.stderr)
    tests = [t for t in tests if t not in missing]
    if not tests:
        raise SystemExit(f"error: {module}: none of its tests exist here")
    work = scratch_copy(module, tests)
    started = time.perf_counter()
    try:
        # the copy lives under /tmp: point tests/conftest.py at the shared CIFAR logits the
        # checkout sees, so tests that read them run against the mutants too
        env = {**os.environ, "CORD_OPS_SHARED_DATA": os.environ.get(
            "CORD_OPS_SHARED_DATA", str(ROOT.parent / "shared" / "data"))}
        if module.startswith("flows/"):
            env["CORD_OPS_MLFLOW_TEMPLATE_DB"] = str(mlflow_template(work))
        run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                              str(max_children)], cwd=work, capture_output=True, text=True,
                             env=env)
        if run.returncode != 0:
            tail = (run.stdout + run.stderr)[-3000:]
            raise SystemExit(f"error: {module}: mutmut run failed ({run.returncode}):\n{tail}")
        listing = subprocess.run([sys.executable, __file__, "--collect", str(work)],
                                 capture_output=True, text=True, check=True)
        mutants = json.loads(listing.stdout)
    finally:
        if keep:
            print(f"  kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    result = {"module": module, "mutants": len(mutants), "killed": 0, "survived": [],
              "accepted": [], "untested": [], "timeout": 0, "other": [],
              "seconds": time.perf_counter() - started, "load_after": os.getloadavg()}
    for name, m in sorted(mutants.items()):
        code = m["code"]
        if code in KILLED:
            result["killed"] += 1
            result["timeout"] += code != 1 and code != 3
            continue
        key = survivor_key(module, function_of(name), m["diff"])
        entry = {"name": name, "key": key, "diff": m["diff"], "code": code}
        if code in SURVIVED:
            why = accepted_reason(key)
            result["accepted" if why else "survived"].append({**entry, "why": why})
        elif code in UNTESTED:
            result["untested"].append(entry)
        else:
            result["other"].append(entry)
    denominator = result["mutants"] - len(result["accepted"])
    result["score"] = result["killed"] / denominator if denominator else 1.0
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", default=list(MODULES), choices=list(MODULES))
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--survivors", action="store_true",
                        help="print every survivor not accepted (key and diff)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--tests", nargs="+", default=[], metavar="MODULE=TEST,TEST",
                        help="run MODULE against these tests instead of its MODULES entry")
    parser.add_argument("--collect", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.collect:
        collect(args.collect)
        return 0

    selection = dict(MODULES)
    for override in args.tests:
        module, _, tests = override.partition("=")
        if module not in MODULES or not tests:
            parser.error(f"--tests {override}: expected MODULE=TEST[,TEST] of a known module")
        selection[module] = tests.split(",")
    load_before = os.getloadavg()
    started = time.perf_counter()
    print(f"{os.cpu_count()} cores, load average {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f} (1/5/15 min) at the start")
    header = (f"{'module':38} {'mutants':>7} {'killed':>6} {'surv':>5} {'equiv':>5} "
              f"{'untest':>6} {'tmout':>5} {'score':>6} {'wall s':>7}")
    print(header)
    results = []
    for module in args.modules:
        r = run_module(module, selection[module], args.max_children, args.keep)
        results.append(r)
        print(f"{module:38} {r['mutants']:7d} {r['killed']:6d} {len(r['survived']):5d} "
              f"{len(r['accepted']):5d} {len(r['untested']):6d} {r['timeout']:5d} "
              f"{100 * r['score']:5.1f}% {r['seconds']:7.0f}  (load {r['load_after'][0]:.1f} "
              f"{r['load_after'][1]:.1f} {r['load_after'][2]:.1f})", flush=True)
        if args.json:  # after each module, so an interrupted run keeps what it measured
            args.json.write_text(json.dumps({"load_before": load_before,
                                             "load_now": os.getloadavg(),
                                             "results": results}, indent=1))
        if args.survivors:
            for e in r["survived"] + r["untested"] + r["other"]:
                print(f"\n# {e['key']}\n# {e['name']} (exit {e['code']})\n{e['diff']}\n",
                      flush=True)
    load_after = os.getloadavg()
    wall = time.perf_counter() - started
    print(f"wall {wall:.0f} s; load average {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f} at the end")
    stale = sorted(set(ACCEPTED) - {e["key"] for r in results for e in r["accepted"]}
                   - {k for k in ACCEPTED if k.split("::")[0] not in args.modules})
    for key in stale:
        print(f"accepted but not seen (stale entry?): {key}")
    if args.json:
        args.json.write_text(json.dumps({"load_before": load_before, "load_after": load_after,
                                         "wall_s": wall, "results": results}, indent=1))
    return 0 if all(r["score"] >= 0.9 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
