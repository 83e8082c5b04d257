"""``cord-ops bench``: one performance table for a folder of .npz logits, logged to MLflow.

Rows: the fit time of each calibrator per dataset (5000 calibration rows, seed 0, after
one warm-up fit unless the first fit took over 2 s); CORD construction (s) and repair (us
per example) as post-warm-up medians [Q1, Q3] over 9 constructions and 21 full-split
repairs with q from IROvA-TS, single-threaded, next to the paper's Table 5; throughput of
the exported ONNX graph in float32 and float64 (onnxruntime CPU, examples per second); and
the end-to-end time of the recalibration flow (load -> fit -> CORD -> ONNX -> parity ->
MLflow -> register). Every figure is taken by :mod:`flows.reproduce.timing`, the protocol
the scripts in ``benchmarks/`` use too.

Calibrator and CORD timings run with BLAS/OpenMP pinned to one thread (as each Dask worker
of ``cord-ops reproduce`` is); onnxruntime and the flow use the machine's defaults.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from cord_ops import CORD, data
from cord_ops.atomic import atomic_path
from flows.platform.prefect_api import prefect_api
from flows.platform.progress import Progress
from flows.reproduce import paper
from flows.reproduce.defaults import BENCH_EXPERIMENT, dataset_and_classifier
from flows.reproduce.report import markdown
from flows.reproduce.timing import measure, once
from flows.store import tracking

CORD_CONSTRUCTIONS = 9
CORD_REPAIRS = 21
ONNX_RUNS = 7
TABLE5_CALIBRATOR = "irova-ts"
#: A first fit slower than this is the measurement itself (no second, warmed-up fit).
WARM_UP_SECONDS = 2.0


def _dataset_files(data_dir) -> dict[str, str]:
    """The first file (sorted) of every dataset prefix in ``data_dir``."""
    firsts: dict[str, str] = {}
    for path in sorted(Path(data_dir).glob("*.npz")):
        firsts.setdefault(dataset_and_classifier(path)[0], str(path))
    if not firsts:
        raise FileNotFoundError(f"--data: {data_dir} holds no .npz files")
    return firsts


def _halves(path: str, seed: int = 0):
    dataset = data.load_npz(path)
    cal_idx, eval_idx = data.split_indices(dataset.n, seed)
    return dataset, cal_idx, eval_idx


def calibrator_rows(dataset_name: str, path: str, calibrators,
                    progress: Progress | None = None) -> list[dict]:
    """Fit seconds and predict us/example of each calibrator on one file's seed-0 split;
    ``progress`` advances after each calibrator."""
    from cord_ops.calibrators import make_calibrator

    dataset, cal_idx, eval_idx = _halves(path)
    x_cal, y_cal, x_eval = dataset.scores[cal_idx], dataset.labels[cal_idx], \
        dataset.scores[eval_idx]
    rows = []
    for name in calibrators:
        def fit(name=name):
            return make_calibrator(name, input_kind=dataset.input_kind).fit(x_cal, y_cal)

        fitted = once(fit)
        if fitted.best < WARM_UP_SECONDS:  # time a second fit; for slow ones warm-up is immaterial
            fitted = once(fit)
        fit_seconds, model = fitted.best, fitted.result
        predict = once(lambda m=model: m.predict_proba(x_eval)).best / x_eval.shape[0] * 1e6
        rows.append({"measure": f"fit {name} (s)", "dataset": dataset_name,
                     "ours": f"{fit_seconds:.3f}", "paper": ""})
        rows.append({"measure": f"predict {name} (us/example)", "dataset": dataset_name,
                     "ours": f"{predict:.2f}", "paper": ""})
        if progress is not None:
            progress.advance(note=f"{dataset_name}: fit {name}")
    return rows


def cord_rows(dataset_name: str, path: str) -> tuple[list[dict], tuple]:
    """Table 5's protocol: CORD construction and repair times with q from IROvA-TS.

    Also returns the fitted (calibrator, CORD, evaluation scores) for the ONNX rows."""
    from cord_ops.calibrators import make_calibrator

    dataset, cal_idx, eval_idx = _halves(path)
    model = make_calibrator(TABLE5_CALIBRATOR, input_kind=dataset.input_kind)
    model.fit(dataset.scores[cal_idx], dataset.labels[cal_idx])
    p0 = dataset.probabilities()
    p_cal, p_eval = p0[cal_idx], p0[eval_idx]
    q_cal = model.predict_proba(dataset.scores[cal_idx])
    q_eval = model.predict_proba(dataset.scores[eval_idx])
    (construction,) = measure(lambda: CORD().fit(p_cal, q_cal), repeats=CORD_CONSTRUCTIONS)
    repair = construction.result
    (repairs,) = measure(lambda: repair.transform(p_eval, q_eval), repeats=CORD_REPAIRS)
    published = paper.TABLE5.get(dataset_name)
    c, r = construction.quartiles(), repairs.quartiles(1e6 / p_eval.shape[0])
    rows = [
        {"measure": "CORD construction (s), median [Q1, Q3]", "dataset": dataset_name,
         "ours": f"{c[0]:.4f} [{c[1]:.4f}, {c[2]:.4f}]",
         "paper": f"{published[0]:.3f}" if published else ""},
        {"measure": "CORD repair (us/example), median [Q1, Q3]", "dataset": dataset_name,
         "ours": f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]",
         "paper": f"{published[1]:.3f}" if published else ""},
    ]
    return rows, (dataset, cal_idx, eval_idx)


def onnx_rows(dataset_name: str, split, calibrator: str) -> list[dict]:
    """Examples per second of the exported pipeline graph on the evaluation half."""
    import onnxruntime

    from cord_ops.calibrators import make_calibrator
    from onnx_export import export_onnx

    dataset, cal_idx, eval_idx = split
    model = make_calibrator(calibrator, input_kind=dataset.input_kind)
    model.fit(dataset.scores[cal_idx], dataset.labels[cal_idx])
    p0 = dataset.probabilities()
    repair = CORD().fit(p0[cal_idx], model.predict_proba(dataset.scores[cal_idx]))
    rows = []
    for dtype in ("float32", "float64"):
        graph = export_onnx(model, repair, dataset.n_classes, dataset.input_kind, dtype)
        session = onnxruntime.InferenceSession(graph.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        scores = np.ascontiguousarray(dataset.scores[eval_idx], dtype=dtype)
        (runs,) = measure(lambda s=session, x=scores: s.run(None, {"scores": x}),
                          repeats=ONNX_RUNS)
        rates = scores.shape[0] / np.asarray(runs.wall)
        rows.append({"measure": f"ONNX {calibrator}+CORD {dtype} (examples/s)",
                     "dataset": dataset_name, "ours": f"{np.median(rates):,.0f}",
                     "paper": ""})
    return rows


def flow_row(dataset_name: str, path: str, calibrator: str, uri: str) -> dict:
    """Wall time of one recalibration flow run on ``path`` (register, no promotion)."""
    from flows.recalibrate.flow import recalibrate

    with prefect_api():
        seconds = once(lambda: recalibrate(data=path, calibrator=calibrator,
                                           model_name="cord-ops-bench", promote=False,
                                           tracking_uri=uri)).best
    return {"measure": f"end-to-end recalibrate flow, {calibrator} (s)",
            "dataset": dataset_name, "ours": f"{seconds:.2f}", "paper": ""}


def run_bench(args: argparse.Namespace) -> int:
    """Measure, print the table, write bench.md/bench.csv to --out, log them to MLflow."""
    from threadpoolctl import threadpool_limits

    if args.data is None:
        print("cord-ops bench: --data is required (../shared/data not found)", file=sys.stderr)
        return 2
    files = _dataset_files(args.data)
    uri = tracking.store_uri()
    rows: list[dict] = []
    started = time.perf_counter()
    # one step per calibrator fit, CORD timing and ONNX timing of each dataset, and the flow
    progress = Progress(len(files) * (len(args.calibrators) + 2) + 1, "bench", unit="steps")
    progress.start()
    for dataset_name, path in files.items():
        with threadpool_limits(1):
            rows += calibrator_rows(dataset_name, path, args.calibrators, progress)
            cord_table, split = cord_rows(dataset_name, path)
        rows += cord_table
        progress.advance(note=f"{dataset_name}: CORD")
        rows += onnx_rows(dataset_name, split, args.onnx_calibrator)
        progress.advance(note=f"{dataset_name}: ONNX")
    first_dataset, first_path = next(iter(files.items()))
    rows.append(flow_row(first_dataset, first_path, args.onnx_calibrator, uri))
    progress.advance(note="recalibrate flow")
    table = pd.DataFrame(rows)
    text = markdown(table)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, payload in (("bench.md", f"# cord-ops bench\n\n{text}"),
                          ("bench.csv", table.to_csv(index=False))):
        with atomic_path(out / name) as tmp:
            tmp.write_text(payload)
    _log(uri, table, out, time.perf_counter() - started)
    return 0


def _log(uri: str, table: pd.DataFrame, out: Path, seconds: float) -> None:
    """One MLflow run holding the table (artifacts) and its numeric entries (metrics)."""
    client = tracking.client(uri)
    run = client.create_run(tracking.experiment_id(client, BENCH_EXPERIMENT), run_name="bench")
    values = {}
    for row in table.itertuples(index=False):
        value = str(row.ours).split(" ")[0].replace(",", "")
        key = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in
                      f"{row.dataset}.{row.measure.split(' (')[0]}")
        values[key] = float(value)
    values["bench_seconds"] = seconds
    try:
        tracking.log_values(client, run.info.run_id, metrics=values)
        for name in ("bench.md", "bench.csv"):
            client.log_artifact(run.info.run_id, str(out / name))
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
