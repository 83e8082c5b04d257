"""The version ``cord-ops serve`` answers with: its ONNX graph loaded from the registry
(:func:`load_version`) in one onnxruntime session and verified before it is served
(:func:`verify`: every repaired row keeps its input's top-1, is finite and sums to 1, and
agrees with cord_ops run from the version's logged state within the export's parity
tolerance); a version that fails either is :class:`VersionRejected`."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cord_ops.softmax import softmax
from flows.errors import CordOpsError
from flows.serve.contract import (
    InputContract,
)

OUTPUTS = ("repaired", "label", "confidence")
#: Rows of the synthetic probe batch every new version is verified on.
PROBE_ROWS = 256


class VersionRejected(CordOpsError, RuntimeError):
    """A version that must not be served (unreadable graph, failed verification)."""


@dataclass(frozen=True, eq=False)
class ServedModel:
    """One verified version and its session; immutable once built."""

    name: str
    version: str
    run_id: str | None
    contract: InputContract
    eta_star: str | None
    calibrator: str | None
    session: object
    providers: tuple[str, ...]
    verification: dict
    loaded_at: float = field(default_factory=time.time)

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "run_id": self.run_id,
                "input_kind": self.contract.input_kind, "n_classes": self.contract.n_classes,
                "input_widths": list(self.contract.widths),
                "dtype": str(self.contract.dtype), "eta_star": self.eta_star,
                "calibrator": self.calibrator, "providers": list(self.providers),
                "verification": self.verification, "loaded_at": self.loaded_at}


# ---------------------------------------------------------------- loading and verification
def _probe_scores(contract: InputContract, seed: int = 0) -> np.ndarray:
    """A seeded batch spanning confident, flat and tied rows, in the graph's input kind."""
    rng = np.random.default_rng(seed)
    k = contract.n_classes
    logits = rng.normal(0.0, 1.0, (PROBE_ROWS, k)) * rng.choice([0.1, 1.0, 4.0, 12.0],
                                                                 (PROBE_ROWS, 1))
    logits[:4] = 0.0  # all-tied rows: the tie rule picks class 0
    if contract.input_kind == "probs":
        return softmax(logits)
    return logits


def _logged_state(tracking_uri: str, run_id: str | None, folder: Path):
    """(calibrator, CORD) rebuilt from the run's ``state/`` JSON, or None without them."""
    from mlflow.exceptions import MlflowException

    from cord_ops import CORD
    from cord_ops.calibrators import calibrator_from_dict
    from flows.store import tracking

    if not run_id:
        return None
    try:
        state = tracking.download_from_run(tracking_uri, run_id, "state", folder)
    except (MlflowException, OSError):
        return None
    paths = state / "calibrator.json", state / "cord.json"
    if not all(p.is_file() for p in paths):
        return None
    return (calibrator_from_dict(json.loads(paths[0].read_text())),
            CORD.from_dict(json.loads(paths[1].read_text())))


def verify(session, contract: InputContract, state=None) -> dict:
    """Check a session before it serves: on the probe batch every ``repaired`` row is
    finite, sums to 1 and keeps the input's top-1 (== ``label``); with the logged
    ``state`` (calibrator, CORD), ``repaired`` matches cord_ops within the export's parity
    tolerance. Returns what was checked; raises VersionRejected naming the failure."""
    from cord_ops.threshold import decisions
    from onnx_export.export import THRESHOLD_KEY
    from onnx_export.parity import FIXED_PARITY_TOLERANCE, parity_tolerance

    # The graph's own input, upcast: parity is defined against cord_ops on the same inputs.
    probe = _probe_scores(contract).astype(contract.dtype).astype(np.float64)
    try:
        repaired, label = session.run(["repaired", "label"],
                                      {session.get_inputs()[0].name: probe.astype(contract.dtype)})
    except Exception as exc:  # any runtime failure on valid input disqualifies the graph
        raise VersionRejected(f"the graph failed on the probe batch ({exc})") from exc
    repaired = repaired.astype(np.float64)
    # a binary graph fitted to keep a decision threshold keeps the decisions at it
    t = session.get_modelmeta().custom_metadata_map.get(THRESHOLD_KEY)
    t = None if t is None or float(t) == 0.5 else float(t)
    expected_top1 = (decisions(probe, None) if t is None else
                     decisions(probe if contract.input_kind == "probs" else softmax(probe), t))
    tolerance = FIXED_PARITY_TOLERANCE[str(contract.dtype)]
    if repaired.shape != probe.shape or not np.isfinite(repaired).all():
        raise VersionRejected("repaired output is not a finite [N, K] array")
    if not np.array_equal(label, expected_top1) or not np.array_equal(decisions(repaired, t),
                                                                      expected_top1):
        raise VersionRejected("repaired output changes a top-1 decision on the probe batch")
    if np.max(np.abs(repaired.sum(axis=1) - 1.0)) > max(tolerance, 1e-6) * contract.n_classes:
        raise VersionRejected("repaired rows do not sum to 1 on the probe batch")
    report = {"probe_rows": int(probe.shape[0]), "top1_kept": True, "reference": None,
              "decision_threshold": t}
    if state is not None:
        calibrator, cord = state
        tolerance = parity_tolerance(calibrator, cord, probe, str(contract.dtype))
        reference = cord.transform(
            probe if contract.input_kind == "probs" else softmax(probe),
            calibrator.predict_proba(probe))
        diff = float(np.max(np.abs(repaired - reference)))
        if not diff <= tolerance:
            raise VersionRejected(f"max |onnx - cord_ops| = {diff:.3g} on the probe batch "
                                  f"exceeds the parity tolerance {tolerance:g}")
        report.update(reference="cord_ops from the run's logged state", max_abs_diff=diff,
                      tolerance=tolerance)
    return report


def load_version(client, tracking_uri: str, name: str, version: str,
                 provider: str = "auto") -> ServedModel:
    """Download, open and verify ``name`` v``version``. Raises VersionRejected for a graph
    that must not be served; store errors propagate unchanged."""
    from flows.store import graphs
    from onnx_export.export import load_model, model_metadata
    from onnx_export.runtime import open_session

    mv = client.get_model_version(name, version)
    with tempfile.TemporaryDirectory(prefix="cord-ops-serve-") as tmp:
        folder = Path(tmp)
        try:  # the graph alone, checked against its run's digest (no stored code runs)
            path = graphs.fetch_graph(client, tracking_uri, name, version, folder)
        except graphs.GraphRejected as exc:
            raise VersionRejected(str(exc)) from exc
        try:
            graph = load_model(path)
            meta = model_metadata(graph)
            contract = InputContract.from_metadata(meta)
            # Two versions share the cores in a rollout; spinning intra-op threads of one
            # take the CPU the other's working threads need.
            session = open_session(graph, provider=provider, spin=False)
        except (ValueError, RuntimeError) as exc:
            raise VersionRejected(f"v{version}: cannot load its graph ({exc})") from exc
        state = _logged_state(tracking_uri, mv.run_id, folder / "state")
    try:
        report = verify(session, contract, state)
    except VersionRejected as exc:
        raise VersionRejected(f"v{version}: {exc}") from exc
    return ServedModel(name=name, version=str(version), run_id=mv.run_id, contract=contract,
                       eta_star=meta.get("cord.eta_star"), calibrator=meta.get("cord.calibrator"),
                       session=session, providers=tuple(session.get_providers()),
                       verification=report)
