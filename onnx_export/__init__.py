"""onnx_export: one ONNX graph per fitted pipeline (calibrator + CORD repair with eta*
baked in), composition with a user's classifier graph, and onnxruntime inference."""

from onnx_export.export import export_onnx, load_model, model_metadata, save_model

__all__ = ["export_onnx", "load_model", "model_metadata", "save_model"]
