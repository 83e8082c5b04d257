"""What a staged rollout costs ``cord-ops serve``: throughput and p99 of the server alone,
with a candidate in shadow, and with a 10 % canary (K = 100, float32 graphs).

    python benchmarks/bench_rollout.py [--seconds 4] [--clients 8 64] [--rows 1 100]

Builds a throw-away store with two registered versions of one model (VS + CORD as
``@champion``, TS + CORD as the candidate), starts one ``cord-ops serve`` and measures
every (clients, rows per request) cell three times: with no rollout, with a shadow
rollout record, and with a canary record at 10 %. The records are written directly
(:func:`flows.promotion.rollout_record.new_record`), skipping ``rollout start``'s
promotability checks, which need a recalibration's run; their budgets are wide and their
minimum evidence out of reach (a step lasts 10^9 s), so the server stays at that step for the whole
measurement; after 50 comparisons a canary compares one answer in ten. Each request carries
its own ``X-Rollout-Key`` (a counter), so the canary answers about 10 % of requests, not
10 % of the clients. The three settings are measured back to back, ``--repeat`` rounds
per cell; prints the medians of requests/s, p50, p99, errors, the shadow copies scored
and dropped, the cost ratios against the server alone (and their range over the rounds),
and the load average.
Goal: shadow costs at most 1.6x in throughput at 8 clients, a canary 1.1x.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serve import K, free_port, measure, start, stop, wait_ready  # noqa: E402

MODEL = "bench-rollout"
SETTINGS = ("alone", "shadow", "canary")


def register_versions(uri: str, artifacts: Path) -> np.ndarray:
    """v1 (VS + CORD, @champion) and v2 (TS + CORD) fitted on synthetic K = 100 logits;
    returns rows to send."""
    from mlflow import MlflowClient
    from scipy.special import softmax

    from cord_ops import CORD
    from cord_ops.calibrators import make_calibrator
    from flows import pyfunc_model
    from flows.store import graphs, registry
    from onnx_export import export_onnx

    rng = np.random.default_rng(0)
    labels = rng.integers(0, K, 3000)
    logits = rng.normal(0.0, 2.0, (3000, K))
    logits[np.arange(3000), labels] += rng.uniform(2.0, 9.0, 3000)
    client = MlflowClient(uri)
    experiment = client.create_experiment(MODEL, artifact_location=artifacts.as_uri())
    registry.ensure_registered_model(client, MODEL)
    for name in ("vs", "ts"):
        calibrator = make_calibrator(name, max_iter=100).fit(logits, labels)
        cord = CORD().fit(softmax(logits, axis=1), calibrator.predict_proba(logits))
        graph = export_onnx(calibrator, cord, K, input_kind="logits", dtype="float32")
        run_id = client.create_run(experiment).info.run_id
        client.log_dict(run_id, calibrator.to_dict(), "state/calibrator.json")
        client.log_dict(run_id, cord.to_dict(), "state/cord.json")
        info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                      logits[:5].astype(np.float32))
        # the digest manifest a recalibration records: serve checks the graph against it
        with tempfile.TemporaryDirectory() as scratch:
            graphs.record_digests(client, uri, run_id, info.model_uri, graph, {},
                                  Path(scratch))
        client.create_model_version(MODEL, source=info.model_uri, run_id=run_id,
                                    model_id=info.model_id)
    client.set_registered_model_alias(MODEL, registry.CHAMPION, "1")
    return logits[:100]


def set_rollout(uri: str, mode: str | None) -> str | None:
    """Write a rollout record of v2 that stays at its first step (None: end any)."""
    from mlflow import MlflowClient

    from flows.promotion import rollout_record
    from flows.promotion.rollout_steps import Budget, Plan

    client = MlflowClient(uri)
    current = rollout_record.read(client, MODEL)
    if mode is None:
        if current is not None and current["state"] == rollout_record.ACTIVE:
            current["state"] = rollout_record.ABORTED
            rollout_record.write(client, MODEL, current)
        return None
    plan = Plan.build(mode, (0.10,), min_requests=50, min_seconds=1e9)
    budget = Budget(max_error_rate=1.0, max_p99_ratio=1e6, max_confidence_shift=1.0)
    record = rollout_record.new_record(MODEL, "2", "1", plan, budget, "benchmark", "bench")
    rollout_record.write(client, MODEL, record)
    return plan.describe(0)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def shadow_counts(base: str) -> tuple[float, float]:
    """(copies scored, copies dropped) so far, from /metrics."""
    scored = dropped = 0.0
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("cord_rollout_shadow_scored_total"):
                scored += float(line.split()[-1])
            elif line.startswith("cord_rollout_shadow_dropped_total"):
                dropped += float(line.split()[-1])
    return scored, dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of the three settings per cell; medians are printed "
                             "(default: 3)")
    args = parser.parse_args()

    bin_dir = Path(sys.executable).parent
    loads = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        os.environ.update({"MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"})
        pool = register_versions(uri, Path(tmp) / "artifacts")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        process = start([str(bin_dir / "cord-ops"), "serve", "--model-name", MODEL,
                         "--port", str(port), "--poll-interval", "0.5"], env,
                        Path(tmp) / "serve.log")
        results = {}
        try:
            wait_ready(f"{base}/health", process)
            # The three settings back to back within each cell: the machine's load drifts
            # less between them than over the whole run.
            for rows in args.rows:
                for clients in args.clients:
                    for setting in SETTINGS * args.repeat:
                        want = set_rollout(uri, None if setting == "alone" else setting)
                        deadline = time.monotonic() + 60
                        while (get_json(f"{base}/rollout")["serving"] or {}).get(
                                "step_name") != want:
                            if time.monotonic() > deadline:
                                raise RuntimeError(f"server did not reach {want}: "
                                                   f"{(Path(tmp) / 'serve.log').read_text()}")
                            time.sleep(0.2)
                        before = shadow_counts(base)
                        r = measure(f"{base}/invocations", pool[:rows], clients, args.seconds,
                                    keyed=True)
                        after = shadow_counts(base)
                        r["shadow_scored"] = after[0] - before[0]
                        r["shadow_dropped"] = after[1] - before[1]
                        r["load"] = os.getloadavg()[0]
                        results.setdefault((setting, clients, rows), []).append(r)
        finally:
            stop(process)
    loads.append(os.getloadavg())

    print(f"cord-ops serve with a rollout, K = {K}, VS + CORD champion, TS + CORD candidate, "
          f"float32, {os.cpu_count()} CPUs, {args.seconds:g} s per cell, median of "
          f"{args.repeat} interleaved rounds")
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in loads[0])}; "
          f"after: {', '.join(f'{x:.1f}' for x in loads[1])}")
    header = (f"{'setting':<8}{'rows/req':>9}{'clients':>8}{'req/s':>8}{'p50 ms':>9}"
              f"{'p99 ms':>9}{'errors':>7}{'copies':>8}{'dropped':>8}{'load':>6}"
              f"{'cost':>7}{'p99 x':>7}   cost range")
    print(header)
    print("-" * len(header))
    def median(setting, clients, rows) -> dict:
        runs = results[setting, clients, rows]
        return {key: float(np.median([r[key] for r in runs])) for key in runs[0]}

    for rows in args.rows:
        for clients in args.clients:
            alone = median("alone", clients, rows)
            for setting in SETTINGS:
                r = median(setting, clients, rows)
                # The spread of the cost over the rounds, each against its own round's alone.
                costs = [a["rps"] / max(x["rps"], 1e-9) for a, x in
                         zip(results["alone", clients, rows], results[setting, clients, rows],
                             strict=True)]
                print(f"{setting:<8}{rows:>9}{clients:>8}{r['rps']:>8.0f}{r['p50']:>9.2f}"
                      f"{r['p99']:>9.2f}{r['errors']:>7.0f}{r['shadow_scored']:>8.0f}"
                      f"{r['shadow_dropped']:>8.0f}{r['load']:>6.1f}"
                      f"{alone['rps'] / max(r['rps'], 1e-9):>6.2f}x"
                      f"{r['p99'] / alone['p99']:>6.2f}x"
                      f"   {min(costs):.2f}-{max(costs):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
