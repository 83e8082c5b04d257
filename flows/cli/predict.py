"""``cord-ops predict``: run an exported graph (a file, or a registered version fetched from
the store) on an .npz or Parquet file, or on a folder or glob of Parquet files on Dask
(:mod:`flows.serve.batch`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from flows import inputs
from flows.cli.context import Invocation
from flows.store import tracking


@dataclass(frozen=True)
class Request:
    """A scoring, checked; ``batch``: a folder or glob ``--input``, or any Dask option,
    selects batch scoring on Dask."""

    invocation: Invocation
    model: str
    input: Path
    output: Path
    overwrite: bool
    batch: bool
    dask_address: str | None
    dask_workers: int | None
    batch_size: int | None
    provider: str


def add_parser(sub) -> None:
    """``predict``: run an exported graph on a file or a folder of Parquet files."""
    p = sub.add_parser("predict", help="run an exported graph on a file, or on a folder of "
                                       "Parquet files with Dask")
    p.add_argument("--model", required=True, help="PATH.onnx or models:/NAME@ALIAS")
    p.add_argument("--input", required=True, type=Path,
                   help=".npz or .parquet with logits or probs; a folder or glob of .parquet "
                        "files scores them on Dask")
    p.add_argument("--output", required=True, type=Path,
                   help="output .npz or .parquet (written atomically); for a folder or glob "
                        "input, a new folder mirroring the input's layout")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output file (refused without it; a batch "
                        "output folder is always new)")
    p.add_argument("--dask-address", help="scheduler of an existing Dask cluster "
                                          "(default: start a local one)")
    p.add_argument("--dask-workers", type=int,
                   help="worker processes of the local cluster (default: 2)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per batch (default: about 2^20 scores, 256..4096 rows)")
    p.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"),
                   help="onnxruntime execution provider (default: cuda when available)")


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    uri = invocation.tracking_uri
    batch = (inputs.is_batch_input(args.input) or args.dask_address is not None
             or args.dask_workers is not None)
    if batch:
        from flows.files import expand_inputs

        try:
            expand_inputs(args.input)
        except ValueError as exc:
            raise inputs.InputError(f"{exc} (given as --input)") from exc
        inputs.new_folder(args.output, "--output")
    else:
        inputs.data_file(args.input, "--input")
        inputs.writable_output(args.output, "--output", args.input, overwrite=args.overwrite)
    inputs.model_reference(uri, args.model)
    if args.batch_size is not None and args.batch_size < 1:
        raise inputs.InputError(f"--batch-size: expected a positive integer, got "
                                f"{args.batch_size}")
    if not batch:
        inputs.scoring_file(args.input, inputs.model_reads(uri, args.model), "--input")
    return Request(invocation, args.model, args.input, args.output, args.overwrite, batch,
                   args.dask_address, args.dask_workers, args.batch_size, args.provider)


def local_model_path(model: str, folder: Path, tracking_uri: str) -> Path:
    """``model`` as a local .onnx file: a path as given, or a registry URI downloaded from
    the store ``tracking_uri`` to ``folder``: a registered version (``models:/NAME@ALIAS``,
    ``models:/NAME/VERSION``) by :func:`flows.store.graphs.fetch_graph` (the graph only,
    checked by digest), any other (``runs:/...``, a logged model's id) as one .onnx file.
    """
    if ":/" not in model:
        return Path(model)
    if model.startswith("models:/") and ("/" in model[8:].strip("/") or "@" in model):
        # a registered version: its graph alone, checked against its run's digest
        from flows.store import graphs

        client = tracking.client(tracking_uri)
        name, version = graphs.version_of(client, model)
        return graphs.fetch_graph(client, tracking_uri, name, version, folder)
    local = tracking.download(tracking_uri, model, folder)
    found = [local] if local.is_file() else sorted(local.rglob("*.onnx"))
    if len(found) != 1:
        raise ValueError(f"{model}: expected one .onnx file in the model, found {len(found)}")
    return found[0]


def run(request: Request) -> int:
    import tempfile

    from cord_ops.data import clip_note
    from onnx_export.predict import predict_file

    if request.batch:
        return _run_batch(request)
    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as folder:
        path = local_model_path(request.model, Path(folder), request.invocation.tracking_uri)
        summary = predict_file(path, request.input, request.output,
                               batch_size=request.batch_size, provider=request.provider,
                               progress=True)
    print(f"wrote {summary['rows']} rows x {summary['n_classes']} classes to "
          f"{summary['output']} (providers: {', '.join(summary['providers'])})")
    if summary["sum_error"] > 0:
        print("input: " + clip_note(summary["input_width"], summary["sum_error"],
                                    summary["sum_error_row"]))
    return 0


def _run_batch(request: Request) -> int:
    """Many Parquet files on a Dask cluster (:mod:`flows.serve.batch`)."""
    import tempfile

    from flows.serve.batch import predict_batch

    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as folder:
        path = local_model_path(request.model, Path(folder), request.invocation.tracking_uri)
        result = predict_batch(path, request.input, request.output,
                               dask_address=request.dask_address,
                               n_workers=request.dask_workers or 2,
                               batch_size=request.batch_size)
    print(f"wrote {result.rows} rows from {result.files} files to {result.output} on "
          f"{len(result.workers)} Dask workers in {result.seconds:.1f} s "
          f"({result.rows / max(result.seconds, 1e-9):,.0f} rows/s)")
    return 0
