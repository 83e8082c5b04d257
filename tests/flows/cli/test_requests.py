"""Each command's validation (``flows.cli.<command>.validate``) reads the parsed arguments into
one frozen request and leaves the namespace as argparse made it; the run receives that
request, so a recalibration's or a labelled monitoring run's file is read once: the run
works on what the validation loaded, even when the file is gone by then."""

from __future__ import annotations

import copy
import dataclasses
import socket
import time

import numpy as np
import pytest

from cord_ops import data
from flows.cli import main as cli
from flows.cli.context import Invocation


def _validated(argv: list[str], uri: str):
    """The request ``validate`` builds from ``argv``, after checking that it left the parsed
    arguments untouched and that the request is frozen."""
    args = cli.build_parser().parse_args(argv)
    before = copy.deepcopy(vars(args))
    request = cli.COMMANDS[args.command].validate(
        args, Invocation(uri, None, False, time.perf_counter()))
    assert vars(args) == before
    assert dataclasses.is_dataclass(request)
    first = dataclasses.fields(request)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(request, first, getattr(request, first))
    return request


def _halves(tmp_path, digits):
    """The digits outputs as a calibration file and an evaluation file."""
    half = digits.n // 2
    return (data.save_npz(tmp_path / "cal.npz", digits.scores[:half], digits.labels[:half],
                          "logits"),
            data.save_npz(tmp_path / "eval.npz", digits.scores[half:], digits.labels[half:],
                          "logits"))


def test_validation_builds_a_frozen_request_and_leaves_the_arguments_as_parsed(
        store, tmp_path, digits, digits_file):
    cal, evaluation = _halves(tmp_path, digits)
    request = _validated(["recalibrate", "--data", str(cal), "--eval-data", str(evaluation),
                          "--model-name", "m", "--seed", "3"], store)
    assert (request.dataset.n, request.evaluation.n) == (digits.n // 2, digits.n - digits.n // 2)
    assert request.shards is None and request.options.seed == 3
    kwargs = request.flow_kwargs("file")
    assert (kwargs["data"], kwargs["eval_data"], kwargs["lock"], kwargs["tracking_uri"]) == \
        (str(cal), str(evaluation), "file", store)

    shards = tmp_path / "shards"
    for i, rows in enumerate((slice(0, 450), slice(450, None))):
        data.save_parquet(shards / f"part-{i}.parquet", digits.scores[rows],
                          digits.labels[rows], "logits")
    with socket.socket() as listening:  # stands in for a Dask scheduler's port
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        request = _validated(["recalibrate", "--data", str(shards), "--calibrator", "ts",
                              "--dask-address", f"127.0.0.1:{port}", "--model-name", "m"],
                             store)
    # The scheduler's address as checked goes to the request, not back into the arguments.
    assert request.shards.dask_address == f"tcp://127.0.0.1:{port}"
    assert request.flow_kwargs("file")["dask_address"] == f"tcp://127.0.0.1:{port}"

    request = _validated(["schedule", "--cron", "0 3 * * *", "--data", str(digits_file),
                          "--label-free-data", "incoming/*.npz"], store)
    assert (request.cron, request.monitor_cron, request.label_free.cron) == \
        ("0 3 * * *", "30 3 * * *", "30 3 * * *")
    assert request.recalibrate_parameters()["data"] == str(digits_file.resolve())
    assert request.monitor_parameters()["data"] == str(digits_file.resolve())

    assert _validated(["demo"], store).dataset is None
    assert _validated(["demo", "--data", str(digits_file)], store).dataset.n == digits.n
    assert _validated(["ui", "--port", "5001"], store).port == 5001
    assert _validated(["server", "status"], store).action == "status"


@pytest.mark.usefixtures("prefect_harness")
def test_the_run_uses_what_validation_loaded_and_every_command_leaves_its_arguments(
        store, tmp_path, digits):
    from flows.cli import monitor, recalibrate

    cal, evaluation = _halves(tmp_path, digits)
    request = _validated(["recalibrate", "--data", str(cal), "--eval-data", str(evaluation),
                          "--model-name", "m"], store)
    cal.unlink()
    evaluation.unlink()  # read once: the run has what the validation loaded
    assert recalibrate.run(request) == 0

    batch = data.save_npz(tmp_path / "batch.npz", digits.scores, digits.labels, "logits")
    request = _validated(["monitor", "--data", str(batch), "--model-name", "m",
                          "--no-recalibrate"], store)
    assert request.label_free is None and request.batch.n == digits.n
    batch.unlink()
    assert monitor.run(request) == 0

    without_labels = tmp_path / "unlabelled.npz"
    np.savez(without_labels, logits=digits.scores)
    request = _validated(["monitor", "--data", str(without_labels), "--model-name", "m"],
                         store)
    assert request.label_free is not None and request.batch is None
    assert [str(path) for path, _, _ in request.label_free.batches] == [str(without_labels)]
    without_labels.unlink()  # read once: the label-free flow has what validation read
    assert monitor.run(request) == 0

    scored = data.save_npz(tmp_path / "score.npz", digits.scores, digits.labels, "logits")
    request = _validated(["predict", "--model", "models:/m@champion", "--input", str(scored),
                          "--output", str(tmp_path / "out.npz")], store)
    assert not request.batch

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    request = _validated(["serve", "--model-name", "m", "--port", str(port),
                          "--allowed-hosts", "example.org"], store)
    assert request.serve_kwargs()["allowed_hosts"] == ("example.org",)
