"""The MLflow tracking store and model registry: tracking URI and client, registered
versions and their gate, ONNX graph loading, the registry lock and journal, owner records,
the pinned reference split, store retries and pre-start reads."""
