"""A staged rollout as an operator runs it: a real store, two real ``cord-ops serve``
processes following one rollout record, real HTTP clients in threads. A candidate goes
shadow -> canary 25 % -> canary 50 % -> promoted (one server restarted mid-way resumes at
the registry's step), then a defective candidate (a graph that changes the decision of one
kind of row) is rolled back; no request fails and every answer comes wholly from the
version it names."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from servers import free_port, running, wait_until_ready

from flows.promotion import rollout_record
from flows.promotion.champion import read_history
from flows.serve.app import VERSION_HEADER
from flows.serve.rollout import KEY_HEADER
from flows.store import registry

pytestmark = pytest.mark.slow

MODEL = "rolled"
POLL = 0.5
#: A value no digits logit has: the defective graph reverses the repaired row when the
#: first input column holds exactly this.
MAGIC = 1234.5
KEYS = [f"caller-{i}" for i in range(40)]


class Traffic:
    """Client threads posting to the servers in turn, each request with one of KEYS as its
    routing key; every answer is recorded. ``pause`` holds new requests (for a restart)."""

    def __init__(self, urls: list[str], payloads: list[dict], threads: int = 4):
        self.urls, self.payloads = urls, payloads
        self.answers: list[dict] = []
        self._stop, self._go = threading.Event(), threading.Event()
        self._go.set()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def _run(self, index: int) -> None:
        n = index
        with httpx.Client(timeout=15.0) as client:
            while not self._stop.is_set():
                self._go.wait()
                if self._stop.is_set():
                    break
                n += len(self._threads)
                url, key = self.urls[n % len(self.urls)], KEYS[n % len(KEYS)]
                which = n % len(self.payloads)
                record = {"url": url, "key": key, "payload": which, "at": time.monotonic()}
                try:
                    response = client.post(f"{url}/invocations",
                                           content=json.dumps(self.payloads[which]).encode(),
                                           headers={"content-type": "application/json",
                                                    KEY_HEADER: key})
                    body = response.json()
                    record.update(status=response.status_code,
                                  header=response.headers.get(VERSION_HEADER),
                                  named=body.get("model", {}).get("version"),
                                  repaired=body.get("predictions", {}).get("repaired"))
                except Exception as exc:  # a failed request is a result, not a crash
                    record.update(status=0, error=repr(exc))
                self.answers.append(record)

    def pause(self) -> None:
        self._go.clear()
        time.sleep(1.0)  # requests already sent are answered

    def resume(self) -> None:
        self._go.set()

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(20)


def _expected(version: str, rows: np.ndarray) -> np.ndarray:
    from mlflow import MlflowClient

    return registry.run_registered_model(MlflowClient(), f"models:/{MODEL}/{version}",
                                         rows)["repaired"]


def _model_file(client, version: str) -> Path:
    location = client.get_model_version_download_uri(MODEL, version)
    return Path(location.removeprefix("file://")) / "artifacts" / "model.onnx"


def _plant(client, version: str, graph: bytes) -> None:
    """Replace ``version``'s graph with ``graph`` as a registry writer would: the file, its
    entry in the run's digest manifest and the manifest's run tag together (a file changed
    alone is refused by its digest before anything runs it)."""
    import hashlib
    import json

    from flows.store import graphs

    _model_file(client, version).write_bytes(graph)
    run_id = client.get_model_version(MODEL, version).run_id
    manifest = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / \
        graphs.DIGESTS_ARTIFACT
    body = json.loads(manifest.read_text())
    body["model"]["files"]["artifacts/model.onnx"] = hashlib.sha256(graph).hexdigest()
    manifest.write_text(json.dumps(body))
    client.set_tag(run_id, graphs.DIGESTS_TAG, hashlib.sha256(manifest.read_bytes()).hexdigest())


def _rename_repaired(g) -> None:
    """Rename graph ``g``'s ``repaired`` to ``repaired_true``, so an added node can produce
    ``repaired`` from it."""
    for node in g.node:
        for i, name in enumerate(node.output):
            if name == "repaired":
                node.output[i] = "repaired_true"
        for i, name in enumerate(node.input):
            if name == "repaired":
                node.input[i] = "repaired_true"


def _disagreeing(graph: bytes) -> bytes:
    """``graph`` changed so that a row whose first input is MAGIC gets its repaired row
    reversed (its top-1 moves, its label does not); every other row is untouched, so the
    version passes its verification, its parity check and its reference split."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load_from_string(graph)
    g = model.graph
    source = g.input[0].name
    elem = g.input[0].type.tensor_type.elem_type
    _rename_repaired(g)
    g.initializer.extend([
        helper.make_tensor("magic_col", TensorProto.INT64, [], [0]),
        helper.make_tensor("magic_value", elem, [], [MAGIC]),
        helper.make_tensor("magic_axis", TensorProto.INT64, [1], [1]),
        helper.make_tensor("rev_start", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("rev_end", TensorProto.INT64, [1], [-(2**62)]),
        helper.make_tensor("rev_step", TensorProto.INT64, [1], [-1]),
    ])
    g.node.extend([
        helper.make_node("Gather", [source, "magic_col"], ["magic_first"], axis=1),
        helper.make_node("Equal", ["magic_first", "magic_value"], ["magic_hit"]),
        helper.make_node("Unsqueeze", ["magic_hit", "magic_axis"], ["magic_hit2"]),
        helper.make_node("Slice", ["repaired_true", "rev_start", "rev_end", "magic_axis",
                                   "rev_step"], ["repaired_reversed"]),
        helper.make_node("Where", ["magic_hit2", "repaired_reversed", "repaired_true"],
                         ["repaired"]),
    ])
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


#: The slow graph's extra work: a loop of SLOW_TRIPS products of a SLOW_SIDE-square matrix
#: (tens of ms a run on one core, whatever the rows: slower than the fast graph by far).
SLOW_SIDE, SLOW_TRIPS = 256, 300


def _slow(graph: bytes) -> bytes:
    """``graph`` with a Loop of matrix products added whose result is multiplied by 0 and
    added to ``repaired``: the answers are bit-for-bit the original's (x + 0 == x), so the
    version passes verification, parity and its reference split, but every run costs the
    loop. The loop's start depends on the input, so onnxruntime cannot fold it away."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(graph)
    g = model.graph
    source = g.input[0].name
    elem = g.input[0].type.tensor_type.elem_type
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    _rename_repaired(g)
    w = np.random.default_rng(0).standard_normal((SLOW_SIDE, SLOW_SIDE)) / np.sqrt(SLOW_SIDE)
    g.initializer.extend([
        numpy_helper.from_array(w.astype(dtype), "slow_w"),
        numpy_helper.from_array(np.ones((SLOW_SIDE, SLOW_SIDE), dtype), "slow_ones"),
        numpy_helper.from_array(np.array(SLOW_TRIPS, np.int64), "slow_trips"),
        numpy_helper.from_array(np.array(True), "slow_cond"),
        numpy_helper.from_array(np.array(0, dtype), "slow_zero"),
    ])
    body = helper.make_graph(
        [helper.make_node("MatMul", ["slow_x", "slow_w"], ["slow_xw"]),
         helper.make_node("Tanh", ["slow_xw"], ["slow_x_next"]),  # bounded: 0 * it is 0
         helper.make_node("Identity", ["slow_cond_in"], ["slow_cond_out"])],
        "slow_body",
        [helper.make_tensor_value_info("slow_i", TensorProto.INT64, []),
         helper.make_tensor_value_info("slow_cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("slow_x", elem, None)],
        [helper.make_tensor_value_info("slow_cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("slow_x_next", elem, None)])
    g.node.extend([
        helper.make_node("ReduceSum", [source], ["slow_sum"], keepdims=0),
        helper.make_node("Tanh", ["slow_sum"], ["slow_seed"]),
        helper.make_node("Mul", ["slow_ones", "slow_seed"], ["slow_x0"]),
        helper.make_node("Loop", ["slow_trips", "slow_cond", "slow_x0"], ["slow_x_end"],
                         body=body),
        helper.make_node("ReduceSum", ["slow_x_end"], ["slow_total"], keepdims=0),
        helper.make_node("Mul", ["slow_total", "slow_zero"], ["slow_nothing"]),
        helper.make_node("Add", ["repaired_true", "slow_nothing"], ["repaired"]),
    ])
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from flows.cli.main import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _wait(condition, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(interval)


def _serve(command, port: int, log: Path):
    return running([*command, "serve", "--model-name", MODEL, "--port", str(port),
                    "--poll-interval", str(POLL)], log)


def test_rollout_shadow_canary_promoted_then_a_defective_candidate_rolled_back(
        store, prefect_harness, digits_file, digits, tmp_path, cord_ops_command, capsys):
    from mlflow import MlflowClient

    from flows.promotion.operations import who
    from flows.recalibrate.flow import recalibrate

    client = MlflowClient()
    first = recalibrate(data=str(digits_file), calibrator="vs", model_name=MODEL)
    second = recalibrate(data=str(digits_file), calibrator="ts", model_name=MODEL,
                         promote=False)
    assert first.decision.promote and not second.decision.promote
    v1, v2 = first.version, second.version
    rows = digits.scores[:6]
    magic_rows = rows.copy()
    magic_rows[2, 0] = MAGIC
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with _serve(cord_ops_command, ports[0], logs[0]) as a, \
            _serve(cord_ops_command, ports[1], logs[1]) as b:
        wait_until_ready(f"{urls[0]}/health", a, logs[0], timeout=60)
        wait_until_ready(f"{urls[1]}/health", b, logs[1], timeout=60)

        # ---- phase 1: v2 through shadow -> 25 % -> 50 % -> promoted
        with Traffic(urls, [{"inputs": rows.tolist()}]) as traffic:
            # The latency rule is left to the slow-graph test: on a loaded machine a
            # canary's p99 can exceed twice the champion's and end this walk early.
            code, out, err = _cli(capsys, "rollout", "start", "--model-name", MODEL,
                                  "--version", v2, "--mode", "shadow", "--steps", "25,50",
                                  "--min-requests", "40", "--min-seconds", "1",
                                  "--max-p99-ratio", "1000",
                                  "--reason", "ts beats vs on the new batch")
            assert code == 0, err
            assert "shadow" in out
            challenger = client.get_model_version_by_alias(MODEL, rollout_record.CHALLENGER)
            assert str(challenger.version) == v2
            # A second rollout while one is active is refused, in one line.
            code, _, err = _cli(capsys, "rollout", "start", "--model-name", MODEL,
                                "--version", v1, "--reason", "x")
            assert code == 1 and "is active" in err.strip().splitlines()[-1]

            # Shadow: the champion answers everything while v2 scores copies.
            _wait(lambda: (httpx.get(f"{urls[0]}/rollout").json()["serving"] or {})
                  .get("figures", {}).get("requests", 0) > 5, 30, "shadow comparisons")
            shadow = httpx.get(f"{urls[0]}/rollout").json()
            assert shadow["serving"]["step_name"] == "shadow"
            assert shadow["serving"]["figures"]["disagreements"] == 0

            # At 25 %: pause the clients (the step cannot gather its evidence), restart
            # server B; it comes back at the registry's step, not at the shadow.
            _wait(lambda: rollout_record.read(client, MODEL)["step"] >= 1, 60, "canary 25 %")
            traffic.pause()
            at = rollout_record.read(client, MODEL)
            assert at["state"] == rollout_record.ACTIVE and at["step"] == 1
            os.killpg(b.pid, signal.SIGTERM)
            assert b.wait(10) == 0
            with _serve(cord_ops_command, ports[1], tmp_path / "b2.log") as b2:
                wait_until_ready(f"{urls[1]}/health", b2, tmp_path / "b2.log", timeout=60)
                resumed = _wait(lambda: httpx.get(f"{urls[1]}/rollout").json()["serving"],
                                30, "restarted server following the rollout")
                assert (resumed["rollout"], resumed["step"], resumed["step_name"]) == (
                    at["id"], 1, "canary 25%")
                # Both servers route every caller the same way at this step.
                routed = {}
                for url in urls:
                    with httpx.Client(timeout=10.0) as http:
                        routed[url] = [http.post(f"{url}/invocations",
                                                 json={"inputs": rows.tolist()},
                                                 headers={KEY_HEADER: key}
                                                 ).headers[VERSION_HEADER] for key in KEYS]
                assert routed[urls[0]] == routed[urls[1]]
                assert 0 < routed[urls[0]].count(v2) < len(KEYS)
                traffic.resume()
                done = _wait(lambda: (r := rollout_record.read(client, MODEL))["state"]
                             != rollout_record.ACTIVE and r, 90, "rollout end")
                assert done["state"] == rollout_record.PROMOTED, done["events"]
                for url in urls:
                    _wait(lambda u=url: httpx.get(f"{u}/version").json()["version"] == v2, 15,
                          f"{url} serving v2")
                time.sleep(0.5)
                metrics = httpx.get(f"{urls[0]}/metrics").text
                traffic.pause()  # before server B stops with the block
        # One write per step however many servers judged it, in order.
        assert [e["what"] for e in done["events"]] == ["start", "advance", "advance",
                                                       "promoted"]
        assert str(client.get_model_version_by_alias(MODEL, registry.CHAMPION).version) == v2
        assert str(registry.champion_version(client, MODEL).version) == v2
        assert rollout_record.CHALLENGER not in client.get_registered_model(MODEL).aliases
        last = read_history(client, MODEL)[-1]
        assert (last["version"], last["from"], last["how"], last["by"]) == (v2, v1, "rollout",
                                                                             who())
        assert done["id"] in last["reason"] and "ts beats vs" in last["reason"]
        assert f'cord_serve_answers_total{{version="{v2}"}}' in metrics
        assert f'cord_rollout_shadow_scored_total{{version="{v2}"}}' in metrics

        expected = {v: _expected(v, rows) for v in (v1, v2)}
        assert not np.allclose(expected[v1], expected[v2], atol=1e-3)
        answers = traffic.answers
        failed = [x for x in answers if x["status"] != 200]
        assert not failed, failed[:3]
        by_key: dict[tuple[str, str], list[str]] = {}
        for x in answers:
            assert x["header"] == x["named"] and x["named"] in (v1, v2)
            np.testing.assert_allclose(x["repaired"], expected[x["named"]], rtol=0, atol=1e-6)
            by_key.setdefault((x["url"], x["key"]), []).append((x["at"], x["named"]))
        # Sticky and monotone: once a caller got v2 from a server, it never got v1 again
        # (server B is one process per run: its answers are all from after its restart, or
        # all from before it).
        for (url, key), seen in by_key.items():
            versions = [v for _, v in sorted(seen)]
            if url == urls[0]:
                assert versions == sorted(versions, key=lambda v: v == v2), (key, versions)
        assert {v1, v2} <= {x["named"] for x in answers}
        code, out, _ = _cli(capsys, "status", "--model-name", MODEL)
        assert code == 0 and f"rollout:  last: v{v2} promoted" in out

        # ---- phase 2: a candidate whose graph reverses one kind of row is rolled back
        third = recalibrate(data=str(digits_file), calibrator="vs", model_name=MODEL,
                            promote=False)
        v3 = third.version
        graph = _model_file(client, v3)
        original = graph.read_bytes()
        graph.write_bytes(original[: len(original) // 2])  # truncated: refused at start
        code, _, err = _cli(capsys, "rollout", "start", "--model-name", MODEL, "--version",
                            v3, "--mode", "canary", "--reason", "try it")
        line = err.strip().splitlines()[-1]
        assert code == 1 and line.startswith("error:") and f"cannot roll out v{v3}" in line
        _plant(client, v3, _disagreeing(original))
        history_before = read_history(client, MODEL)
        # Ordinary rows first, until v3 has answered some of them; only then the rows that
        # show its defect (sent together from the start, which comes first is a race).
        with Traffic(urls[:1], [{"inputs": rows.tolist()}]) as normal:
            time.sleep(0.5)
            code, _, err = _cli(capsys, "rollout", "start", "--model-name", MODEL,
                                "--version", v3, "--mode", "canary", "--steps", "50",
                                "--min-requests", "100000", "--min-seconds", "1",
                                "--reason", "vs refit")
            assert code == 0, err
            _wait(lambda: any(x.get("named") == v3 for x in list(normal.answers)), 60,
                  "v3 answering canary rows")
            assert rollout_record.read(client, MODEL)["state"] == rollout_record.ACTIVE
            with Traffic(urls[:1], [{"inputs": magic_rows.tolist()}], threads=2) as magic:
                ended = _wait(lambda: (r := rollout_record.read(client, MODEL))["state"]
                              != rollout_record.ACTIVE and r, 60, "rollback")
                time.sleep(1.0)
        assert ended["state"] == rollout_record.ROLLED_BACK, ended
        assert "top-1 disagrees" in ended["outcome"], ended["outcome"]
        assert str(registry.champion_version(client, MODEL).version) == v2
        assert read_history(client, MODEL) == history_before  # no champion moved
        answers = normal.answers + magic.answers
        assert answers and all(x["status"] == 200 for x in answers), \
            [x for x in answers if x["status"] != 200][:3]
        sent_magic = magic.answers
        assert sent_magic and all(x["named"] == v2 for x in sent_magic)  # never v3's answer
        good = _expected(v2, magic_rows)
        for x in sent_magic:
            np.testing.assert_allclose(x["repaired"], good, rtol=0, atol=1e-6)
        assert any(x["named"] == v3 for x in normal.answers)  # v3 answered ordinary rows
        # The defect is logged with the row that showed it.
        assert f"breaks an invariant on row 2: input [{MAGIC:g}, " in logs[0].read_text()
        code, _, err = _cli(capsys, "rollout", "abort", "--model-name", MODEL)
        assert code == 1 and "no active rollout" in err


def _two_versions(digits_file):
    """v1 (VS, @champion) and v2 (TS, registered without promotion) of MODEL."""
    from flows.recalibrate.flow import recalibrate

    first = recalibrate(data=str(digits_file), calibrator="vs", model_name=MODEL)
    second = recalibrate(data=str(digits_file), calibrator="ts", model_name=MODEL,
                         promote=False)
    assert first.decision.promote and not second.decision.promote
    return first.version, second.version


def _check_answers(answers: list[dict], expected: dict[str, np.ndarray]) -> None:
    """No request failed, and each answer is wholly the one of the version it names."""
    assert answers and all(x["status"] == 200 for x in answers), \
        [x for x in answers if x["status"] != 200][:3]
    for x in answers:
        assert x["header"] == x["named"] and x["named"] in expected, x
        np.testing.assert_allclose(x["repaired"], expected[x["named"]], rtol=0, atol=1e-6)


def test_a_slow_candidate_rolled_back_on_its_latency_budget(
        store, prefect_harness, digits_file, digits, tmp_path, cord_ops_command, capsys):
    """A candidate whose graph answers exactly as it should but spends tens of ms a run
    in a useless loop answers canary callers (correctly) until it has its latency samples,
    then is rolled back on the p99 budget; the champion answers everyone after that."""
    from mlflow import MlflowClient

    client = MlflowClient()
    v1, v2 = _two_versions(digits_file)
    _plant(client, v2, _slow(_model_file(client, v2).read_bytes()))
    rows = digits.scores[:6]
    expected = {v: _expected(v, rows) for v in (v1, v2)}  # v2's from its slow graph
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    with _serve(cord_ops_command, port, log) as server:
        wait_until_ready(f"{url}/health", server, log, timeout=60)
        history_before = read_history(client, MODEL)
        with Traffic([url], [{"inputs": rows.tolist()}]) as during:
            code, _, err = _cli(capsys, "rollout", "start", "--model-name", MODEL,
                                "--version", v2, "--mode", "canary", "--steps", "50",
                                "--min-requests", "100000", "--min-seconds", "1",
                                "--reason", "ts, slow graph")
            assert code == 0, err
            try:
                ended = _wait(lambda: (r := rollout_record.read(client, MODEL))["state"]
                              != rollout_record.ACTIVE and r, 60, "rollback")
            except AssertionError as exc:  # with what the server measured
                raise AssertionError(f"{exc}: {httpx.get(f'{url}/rollout').json()}") from None
        with Traffic([url], [{"inputs": rows.tolist()}]) as after:
            time.sleep(1.0)
    assert ended["state"] == rollout_record.ROLLED_BACK, ended
    assert "p99 scoring time" in ended["outcome"], ended["outcome"]
    assert "top-1" not in ended["outcome"] and "failed" not in ended["outcome"]
    assert str(registry.champion_version(client, MODEL).version) == v1
    assert read_history(client, MODEL) == history_before
    _check_answers(during.answers + after.answers, expected)
    assert any(x["named"] == v2 for x in during.answers)  # it did answer, correctly
    assert {x["named"] for x in after.answers} == {v1}


def test_a_candidate_deleted_or_emptied_during_its_rollout_is_rolled_back(
        store, prefect_harness, digits_file, digits, tmp_path, cord_ops_command, capsys):
    """A candidate answering canary callers is deleted from the registry (then another has
    its model files removed from the artifact store): the server, which holds it in memory
    and could go on serving it, rolls the rollout back naming why; no request fails and
    the champion does not move."""
    import shutil

    from mlflow import MlflowClient

    from flows.recalibrate.flow import recalibrate

    client = MlflowClient()
    v1, v2 = _two_versions(digits_file)
    v3 = recalibrate(data=str(digits_file), calibrator="vs", model_name=MODEL,
                     promote=False).version
    rows = digits.scores[:6]
    expected = {v: _expected(v, rows) for v in (v1, v2, v3)}  # before they go
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    history_before = read_history(client, MODEL)

    def remove_files(version: str) -> None:
        folder = Path(client.get_model_version_download_uri(MODEL, version)
                      .removeprefix("file://"))
        assert folder != Path(client.get_model_version_download_uri(MODEL, v1)
                              .removeprefix("file://"))
        shutil.rmtree(folder)

    outcomes, answers = {}, []
    with _serve(cord_ops_command, port, log) as server:
        wait_until_ready(f"{url}/health", server, log, timeout=60)
        for version, remove in ((v2, lambda v: client.delete_model_version(MODEL, v)),
                                (v3, remove_files)):
            with Traffic([url], [{"inputs": rows.tolist()}]) as during:
                code, _, err = _cli(capsys, "rollout", "start", "--model-name", MODEL,
                                    "--version", version, "--mode", "canary", "--steps",
                                    "50", "--min-requests", "100000", "--min-seconds", "1",
                                    # the removal must end it, not a loaded machine's p99
                                    "--max-p99-ratio", "1000", "--reason", "to be removed")
                assert code == 0, err
                _wait(lambda v=version: any(x.get("named") == v for x in list(during.answers)),
                      60, f"v{version} answering canary rows")
                remove(version)
                ended = _wait(lambda: (r := rollout_record.read(client, MODEL))["state"]
                              != rollout_record.ACTIVE and r, 30, f"rollback of v{version}")
            with Traffic([url], [{"inputs": rows.tolist()}]) as after:
                time.sleep(1.0)
            assert ended["state"] == rollout_record.ROLLED_BACK, ended
            assert {x["named"] for x in after.answers} == {v1}
            outcomes[version] = ended["outcome"]
            answers += during.answers + after.answers
    assert outcomes[v2] == f"candidate v{v2} was deleted from the registry during the rollout"
    assert outcomes[v3].startswith(f"candidate v{v3}'s model files are gone from the "
                                   "artifact store"), outcomes[v3]
    _check_answers(answers, expected)
    assert str(registry.champion_version(client, MODEL).version) == v1
    assert read_history(client, MODEL) == history_before
    assert rollout_record.CHALLENGER not in client.get_registered_model(MODEL).aliases
    assert "registry poll failed" not in log.read_text()
