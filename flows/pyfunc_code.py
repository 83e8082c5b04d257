"""MLflow "models from code" entry of a registered cord-ops model.

MLflow copies this file into every logged model and executes it when the model is loaded
(``mlflow.pyfunc.load_model``, ``mlflow models serve``, ``spark_udf``); it binds the
installed :class:`flows.pyfunc_model.CordOnnxModel`, so the stored model holds no pickled
object. It is not meant to be imported: executing it registers the model with MLflow.
"""

from mlflow.models import set_model

try:
    from flows.pyfunc_model import CordOnnxModel
except ImportError as exc:
    raise ImportError(
        "this cord-ops model needs the cord-ops package where it is loaded "
        f"({exc}); install it there and serve with --env-manager local") from exc

set_model(CordOnnxModel())
