"""onnx_export: one ONNX graph per fitted pipeline (calibrator + CORD repair with eta*
baked in), composition with a user's classifier graph (or, for a
``CORDCalibratedClassifier``, skl2onnx's), and onnxruntime inference."""

from onnx_export.classifier import export_calibrated_classifier
from onnx_export.compose import compose_with_classifier
from onnx_export.export import export_onnx, load_model, model_metadata, save_model
from onnx_export.predict import predict_file
from onnx_export.runtime import open_session, run_batched

__all__ = [
    "compose_with_classifier",
    "export_calibrated_classifier",
    "export_onnx",
    "load_model",
    "model_metadata",
    "open_session",
    "predict_file",
    "run_batched",
    "save_model",
]
