"""The registered model's pyfunc flavour: the exported ONNX graph run by onnxruntime behind
MLflow's ``python_function`` interface, with the input rules of :mod:`flows.serve.contract`.

What one logged model holds (``MODEL_ARTIFACT`` of a recalibration run):

- ``artifacts/model.onnx``: the graph itself, also declared as an ``onnx`` flavour, so
  onnxruntime users take the file (or ``mlflow.onnx.load_model``) and skip Python entirely;
- ``pyfunc_code.py``: MLflow's *models from code* entry (a copy of
  :mod:`flows.pyfunc_code`), which binds :class:`CordOnnxModel` from the installed cord-ops
  package. Nothing is pickled: the model is this class plus the ``.onnx`` artifact.
- a signature with the outputs and the ``outputs`` parameter, but no input schema: MLflow's
  own schema enforcement would refuse float64 arrays for a float32 graph and DataFrames
  with an array column, and would let NaN through, so the input contract is enforced here
  instead (and described in the model's metadata: ``cord.n_classes``, ``cord.input_kind``,
  ``cord.input_widths`` (``1,2`` for a binary model, which also takes one score column;
  else K), ``cord.dtype``).

Loading needs cord-ops installed where the model is served (``mlflow models serve
--env-manager local``, ``spark_udf(..., env_manager="local")``); it is not listed in the
model's pip requirements because it is not published on a package index. This flavour is
for MLflow's own tools, which execute ``pyfunc_code.py``; cord-ops itself never loads it
and runs only the ``.onnx`` file (:mod:`flows.store.graphs`, docs/security.md item 2).

``predict`` returns a dict of arrays: ``repaired`` [n, K], ``label`` [n] (the input's
top-1, which ``repaired`` keeps) and ``confidence`` [n] by default; the ``outputs``
parameter (a list of names, or ``["all"]``) selects among every graph output
(``calibrated`` and ``original`` too). A refused input raises
``MlflowException(INVALID_PARAMETER_VALUE)`` with the one-line reason, which MLflow's
scoring server answers with HTTP 400.
"""

from __future__ import annotations

import os
from importlib import metadata as package_metadata
from pathlib import Path

import mlflow.pyfunc
import numpy as np

from cord_ops.atomic import owned_temporary_directory
from flows.serve.contract import InputContract, ScoringInputError, score_matrix

ONNX_ARTIFACT = "onnx_model"
ONNX_FILE = "model.onnx"
#: Where MLflow's pyfunc flavour copies artifact ``ONNX_ARTIFACT`` inside the model folder.
ONNX_PATH_IN_MODEL = f"artifacts/{ONNX_FILE}"
CODE_FILE = Path(__file__).with_name("pyfunc_code.py")
DEFAULT_OUTPUTS = ("repaired", "label", "confidence")
ALL_OUTPUTS = ("repaired", "calibrated", "original", "label", "confidence")
#: Third-party packages the flavour imports at load time (pinned to what logged it).
REQUIREMENTS = ("mlflow", "onnx", "onnxruntime", "numpy", "pandas", "scipy", "scikit-learn")


class CordOnnxModel(mlflow.pyfunc.PythonModel):
    """Runs ``artifacts/model.onnx`` with onnxruntime (CUDA when onnxruntime-gpu and a GPU
    are present, else CPU) after validating the input."""

    def load_context(self, context) -> None:
        from onnx_export.export import load_model, model_metadata
        from onnx_export.runtime import open_session

        path = context.artifacts[ONNX_ARTIFACT]
        graph = load_model(path)
        self.contract = InputContract.from_metadata(model_metadata(graph))
        self.session = open_session(graph, provider="auto")

    # np.ndarray is one of the hints MLflow takes as "no schema from this hint": it neither
    # converts nor validates the input (score_matrix does, DataFrames included), and it
    # stops MLflow's "Add type hints" warning at import and at logging.
    def predict(self, context, model_input: np.ndarray, params=None) -> dict[str, np.ndarray]:
        from mlflow.exceptions import MlflowException

        names = _output_names((params or {}).get("outputs"))
        try:
            scores = score_matrix(model_input, self.contract)
        except ScoringInputError as exc:
            raise MlflowException.invalid_parameter_value(str(exc)) from None
        from onnx_export.runtime import run_batched

        return run_batched(self.session, scores, outputs=list(names))


def _output_names(requested) -> tuple[str, ...]:
    if requested is None:
        return DEFAULT_OUTPUTS
    requested = [requested] if isinstance(requested, str) else list(requested)
    if requested == ["all"]:
        return ALL_OUTPUTS
    unknown = [name for name in requested if name not in ALL_OUTPUTS]
    if unknown or not requested:
        from mlflow.exceptions import MlflowException

        raise MlflowException.invalid_parameter_value(
            f"params.outputs: expected names among {ALL_OUTPUTS} or ['all'], got {requested}")
    return tuple(requested)


# ---------------------------------------------------------------- logging
def signature(graph):
    """Outputs of the default ``predict`` (tensor specs from the graph) and the ``outputs``
    parameter; no input schema (see the module docstring)."""
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec
    from mlflow.types.schema import ParamSchema, ParamSpec

    def spec(value_info) -> TensorSpec:
        tensor = value_info.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        return TensorSpec(np.dtype(dtype), shape, value_info.name)

    outputs = {v.name: v for v in graph.graph.output}
    return ModelSignature(
        inputs=None,
        outputs=Schema([spec(outputs[name]) for name in DEFAULT_OUTPUTS]),
        params=ParamSchema([ParamSpec("outputs", "string", list(DEFAULT_OUTPUTS), (-1,))]),
    )


def pip_requirements() -> list[str]:
    return [f"{name}=={package_metadata.version(name)}" for name in REQUIREMENTS]


class _PyfuncWithOnnxFlavor:
    """A flavour "module" for ``mlflow.models.Model.log``: the pyfunc model of this module
    plus an ``onnx`` flavour entry pointing at the same ``.onnx`` file."""

    __name__ = "cord_ops_onnx_pyfunc"

    @staticmethod
    def save_model(path, mlflow_model, onnx_path, **kwargs):
        import onnx
        from mlflow.models.model import MLMODEL_FILE_NAME

        mlflow.pyfunc.save_model(path=path, mlflow_model=mlflow_model,
                                 python_model=str(CODE_FILE),
                                 artifacts={ONNX_ARTIFACT: str(onnx_path)}, **kwargs)
        mlflow_model.add_flavor("onnx", onnx_version=onnx.__version__, data=ONNX_PATH_IN_MODEL,
                                providers=["CPUExecutionProvider"], code=None)
        mlflow_model.save(os.path.join(path, MLMODEL_FILE_NAME))


def log_model(client, run_id: str, experiment_id: str, graph, example: np.ndarray,
              name: str = "model"):
    """Log ``graph`` as this module's pyfunc model under run ``run_id``; returns ModelInfo.

    The logged model is created with ``client`` in ``experiment_id`` first, so nothing
    depends on MLflow's process-wide active experiment or run. ``example`` (a few rows of
    scores in the graph's dtype) becomes the input example.
    """
    from flows.store import tracking
    from onnx_export.export import model_metadata, save_model

    meta = model_metadata(graph)
    # a command killed while logging leaves this folder; the next log_model sweeps it
    with owned_temporary_directory("cord-ops-onnx-") as folder:
        onnx_path = save_model(graph, folder / ONNX_FILE)

        def save(path: str, mlflow_model) -> None:
            _PyfuncWithOnnxFlavor.save_model(
                path, mlflow_model, onnx_path, signature=signature(graph),
                input_example=example, pip_requirements=pip_requirements(),
                metadata={key: meta[key] for key in ("cord.n_classes", "cord.input_kind",
                                                     "cord.input_widths", "cord.dtype",
                                                     "cord.eta_star", "cord.calibrator")
                          if key in meta})

        # Explicit ids all the way: MLflow's Model.log would look the logged model up
        # through the process-wide tracking URI, which this project never sets.
        return tracking.log_model(client, run_id, name, save, experiment_id=experiment_id)
