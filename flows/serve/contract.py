"""What a served cord-ops model accepts, in one place: the registered model's pyfunc flavour
(:mod:`flows.pyfunc_model`, also under ``mlflow models serve`` and ``spark_udf``) and
``cord-ops serve`` (:mod:`flows.serve.app`) both turn their input into a score matrix here, so
the two refuse the same inputs with the same one-line messages.

Accepted forms of a batch of ``n`` rows for a model of ``K`` classes:

- a float32 or float64 (or integer) array ``[n, K]``, or a nested list of numbers;
- a pandas DataFrame with ``K`` numeric columns (any names, taken in order), or with one
  column whose cells are length-``K`` arrays or lists (what ``spark_udf`` passes for an
  array column);
- for a binary model (K = 2) also one score column: an array ``[n]`` or ``[n, 1]``, a
  flat list of n numbers, a one-column DataFrame: the positive class's probability, or
  a logit / ``decision_function`` margin, whichever kind the model reads;
- a dict holding exactly one of the above (``{"scores": ...}``, the graph's input name).

The value rules are the loaders' (``cord_ops.validation.stored_scores``, the same rules
and messages as every other entry point): finite values, exactly ``K`` columns (or one
for a binary model), and for models that read probabilities, non-negative rows summing
to 1 within the storage dtype's tolerance, renormalised before they are scored. A float64
value too large for a float32 graph is refused rather than turned into inf. Every refusal
is a :class:`ScoringInputError` whose ``reason`` is a short code (used as a metric label) and
whose message names the input, the first offending row and the expectation.

:func:`from_payload` reads the JSON bodies of MLflow's scoring protocol (``inputs``,
``instances``, ``dataframe_split``, ``dataframe_records``) into one of the forms above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cord_ops.names import INPUT_KINDS
from cord_ops.validation import is_one_column, narrowed, stored_scores
from flows.errors import CordOpsError

#: Codes of :attr:`ScoringInputError.reason`.
REASONS = ("bad_payload", "bad_shape", "wrong_width", "non_finite", "not_probabilities",
           "out_of_range", "unsupported_params")
PAYLOAD_KEYS = ("inputs", "instances", "dataframe_split", "dataframe_records")


class ScoringInputError(CordOpsError, ValueError):
    """A refused input; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str):
        if reason not in REASONS:
            raise ValueError(f"reason: expected one of {REASONS}, got {reason!r}")
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True)
class InputContract:
    """What one graph reads: K columns of logits or probabilities, in ``dtype`` (for
    K = 2 also one score column)."""

    n_classes: int
    input_kind: str
    dtype: np.dtype

    def __post_init__(self):
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"input_kind: expected one of {INPUT_KINDS}, "
                             f"got {self.input_kind!r}")
        if self.n_classes < 2:
            raise ValueError(f"n_classes: expected an integer >= 2, got {self.n_classes!r}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float32 or float64, got {self.dtype}")

    @property
    def widths(self) -> tuple[int, ...]:
        """Score columns an input may have: K, and for a binary model also 1."""
        return (1, 2) if self.n_classes == 2 else (self.n_classes,)

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> InputContract:
        """From an exported graph's metadata (``cord.n_classes``, ``cord.input_kind``,
        ``cord.dtype``; see ``onnx_export.export``)."""
        try:
            return cls(int(metadata["cord.n_classes"]), metadata["cord.input_kind"],
                       np.dtype(metadata["cord.dtype"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a cord-ops pipeline graph (metadata: {exc})") from exc


def score_matrix(value, contract: InputContract, name: str = "input") -> np.ndarray:
    """``value`` as a C-contiguous ``[n, K]`` array in the contract's dtype, or ScoringInputError
    (one score column of a binary model as its two columns, probability rows
    renormalised: ``cord_ops.validation.stored_scores``)."""
    arr = _as_array(value, name)
    try:
        # (a binary model's own message, naming both widths, is stored_scores')
        if arr.ndim == 2 and arr.shape[1] != contract.n_classes != 2:
            raise ValueError(f"{name}: expected {contract.n_classes} classes (columns), got "
                             f"{arr.shape[1]}")
        stored = stored_scores(arr, contract.input_kind, name, n_classes=contract.n_classes)
    except (TypeError, ValueError) as exc:
        raise ScoringInputError(_reason(arr, contract), str(exc)) from None
    with np.errstate(over="ignore"):  # overflow is what the next line looks for
        out = narrowed(stored, contract.dtype)
    if out.dtype != arr.dtype and not (np.isfinite(out.min()) and np.isfinite(out.max())):
        row = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
        raise ScoringInputError("out_of_range",
                                f"{name}: row {row} has a value outside the {contract.dtype} range "
                                f"of this model (|x| <= {np.finfo(contract.dtype).max:.3g})")
    return out


def _reason(arr: np.ndarray, contract: InputContract) -> str:
    """Which rule ``arr`` broke (it failed the cord_ops check), as a :data:`REASONS` code."""
    one_column = contract.n_classes == 2 and is_one_column(arr)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0 or arr.dtype.kind not in "iuf" or (
            arr.ndim == 1 and not one_column):
        return "bad_shape"
    if arr.shape[1:] != (contract.n_classes,) and not one_column:
        return "wrong_width"
    if not np.isfinite(arr).all():
        return "non_finite"
    return "not_probabilities"


def _as_array(value, name: str) -> np.ndarray:
    """Any accepted form as an ndarray (not yet checked for width or values)."""
    if isinstance(value, dict):
        if len(value) != 1:
            raise ScoringInputError("bad_shape", f"{name}: expected one input (the scores), got "
                                                 f"{len(value)}: {sorted(map(str, value))}")
        ((key, value),) = value.items()
        name = f"{name}[{key!r}]"
    frame_type = _pandas_types()
    if frame_type is not None and isinstance(value, frame_type):
        return _frame_array(value, name)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf":
        return value
    return _list_array(value, name)


def _pandas_types():
    import sys

    pandas = sys.modules.get("pandas")  # no pandas imported: no DataFrame can reach us
    return None if pandas is None else (pandas.DataFrame, pandas.Series)


def _frame_array(frame, name: str) -> np.ndarray:
    import pandas as pd

    if isinstance(frame, pd.Series):
        frame = frame.to_frame()
    if frame.shape[1] == 1 and frame.dtypes.iloc[0].kind not in "iuf":
        return _list_array(list(frame.iloc[:, 0]), f"{name} column {frame.columns[0]!r}")
    for column, dtype in frame.dtypes.items():
        if dtype.kind not in "iuf":
            raise ScoringInputError("bad_shape", f"{name}: column {column!r} has dtype {dtype}; "
                                                 "expected numeric columns (one per class) or one "
                                                 "column of arrays")
    return frame.to_numpy()


def _list_array(value, name: str) -> np.ndarray:
    """Nested lists (or an object array of rows) as a float array; null entries become NaN
    so they are refused as non-finite with their row."""
    try:
        arr = np.asarray(value)
    except ValueError:  # ragged nesting deeper than one level
        arr = None
    if arr is not None and arr.dtype.kind in "iuf":
        return arr
    if arr is not None and arr.dtype.kind in "USb":
        raise ScoringInputError("bad_shape", f"{name}: expected numbers, got {arr.dtype} values")
    rows = list(value) if not np.isscalar(value) and value is not None else None
    if rows is None:
        raise ScoringInputError("bad_shape", f"{name}: expected a 2-D array (n, K) of numbers, "
                                             f"got {type(value).__name__}")
    widths = [np.size(row) if not np.isscalar(row) and row is not None else -1 for row in rows]
    for row, width in enumerate(widths):
        if width != widths[0]:
            raise ScoringInputError(
                "bad_shape", f"{name}: row {row} has {width} values but row 0 has "
                             f"{widths[0]}; expected rows of equal length")
    try:
        arr = np.asarray([np.asarray(row, dtype=np.float64) for row in rows]) if rows else \
            np.empty((0, 0))
    except (TypeError, ValueError) as exc:
        raise ScoringInputError("bad_shape", f"{name}: expected numbers ({exc})") from None
    return arr


# ---------------------------------------------------------------- MLflow scoring payloads
def from_payload(body) -> object:
    """The batch inside an MLflow scoring request body (already JSON-decoded).

    Exactly one of :data:`PAYLOAD_KEYS`; ``params`` only when empty (the served graph takes
    none, and params silently ignored would answer something the caller did not ask for).
    ``inputs`` and ``instances`` hold rows (or a dict naming one input); ``dataframe_split`` holds
    ``columns`` and ``data``; ``dataframe_records`` a list of row objects.
    """
    if not isinstance(body, dict):
        raise ScoringInputError(
            "bad_payload", f"request body: expected a JSON object with one of "
                           f"{', '.join(PAYLOAD_KEYS)}, got {type(body).__name__}")
    keys = [key for key in PAYLOAD_KEYS if key in body]
    unknown = sorted(set(body) - set(PAYLOAD_KEYS) - {"params"})
    if len(keys) != 1 or unknown:
        raise ScoringInputError(
            "bad_payload", f"request body: expected exactly one of "
                           f"{', '.join(PAYLOAD_KEYS)}, got keys {sorted(body)}")
    params = body.get("params")
    if params not in (None, {}):
        named = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ScoringInputError(
            "unsupported_params", f"request body: params {named} are not supported (the "
                                  "served graph takes none; every answer holds the repaired "
                                  "probabilities, the label and the confidence)")
    (key,) = keys
    value = body[key]
    if key == "dataframe_split":
        return _split_rows(value)
    if key == "dataframe_records":
        return _record_rows(value)
    if key == "instances" and isinstance(value, list) and value and isinstance(value[0], dict):
        return _record_rows(value, what="instances")
    if isinstance(value, dict) and len(value) == 1:
        return value  # {"scores": rows}
    if not isinstance(value, list):
        raise ScoringInputError("bad_payload", f"{key}: expected a list of rows, got "
                                               f"{type(value).__name__}")
    return value


def _one_column(rows: list, columns: list):
    """Rows of a one-column frame whose cells are arrays: the cells themselves."""
    if len(columns) == 1 and rows and isinstance(rows[0], list) and rows[0] \
            and isinstance(rows[0][0], list):
        return [row[0] if isinstance(row, list) and len(row) == 1 else row for row in rows]
    return rows


def _split_rows(value):
    if not isinstance(value, dict) or not isinstance(value.get("data"), list):
        raise ScoringInputError("bad_payload", "dataframe_split: expected an object with 'columns' "
                                               "and a 'data' list of rows")
    columns = value.get("columns") or []
    return _one_column(value["data"], columns)


def _record_rows(value, what: str = "dataframe_records"):
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise ScoringInputError("bad_payload", f"{what}: expected a list of row objects")
    if not value:
        return []
    columns = list(value[0])
    rows = []
    for index, record in enumerate(value):
        if list(record) != columns:
            raise ScoringInputError(
                "bad_payload", f"{what}: row {index} has fields {list(record)}; "
                               f"expected {columns} as in row 0")
        rows.append([record[c] for c in columns])
    return _one_column(rows, columns)
