"""``serve`` of a model without ``@champion``: it says so once, in words and with
the command that sets one, keeps polling quietly, and counts no outage; on a real store."""

from __future__ import annotations


def test_a_model_without_its_alias_is_said_once_with_the_next_step(store, capsys):
    from mlflow import MlflowClient

    from flows.serve.follower import RegistryFollower
    from flows.serve.metrics import Metrics

    MlflowClient(store).create_registered_model("waiting")
    metrics = Metrics()
    follower = RegistryFollower(store, "waiting", "champion", 1.0, metrics)
    for _ in range(3):
        follower.poll_once()
    expected = ("waiting has no @champion yet; serving starts when one is set "
                "(`cord-ops status --model-name waiting` says why; `cord-ops promote "
                "--model-name waiting --version N --reason TEXT` sets it)")
    assert capsys.readouterr().err.splitlines() == [f"cord-ops serve: {expected}"]
    assert follower.last_error == expected and follower.current is None
    assert "cord_serve_poll_errors_total 0.0" in metrics.render().decode()


def test_a_rollout_ended_elsewhere_is_said_once_by_the_server_routing_it(store, capsys):
    """An operator's `rollout abort` ended a rollout this server was routing: the server
    says so, once, instead of going quiet."""
    import json
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from flows.promotion.rollout_steps import ROLLOUT_TAG, Budget, Plan
    from flows.serve.metrics import Metrics
    from flows.serve.rollout import ActiveStep, RolloutController

    client = MlflowClient(store)
    client.create_registered_model("rolled")
    client.set_registered_model_tag("rolled", ROLLOUT_TAG, json.dumps({
        "schema": 1, "state": "aborted", "id": "r7", "version": "2", "champion": "1",
        "outcome": "aborted by alice: the new batch was mislabelled"}))
    follower = SimpleNamespace(tracking_uri=store, name="rolled", interval=1.0, current=None,
                               provider="cpu")
    controller = RolloutController(follower, Metrics())
    controller.step = ActiveStep("r7", 3, 1, Plan.build("shadow", (0.25,), 10, 1.0), Budget(),
                                 0.0, "1", None)
    controller.refresh()
    controller.refresh()
    assert capsys.readouterr().err.splitlines() == [
        "cord-ops serve: rollout: rollout r7 (v2) ended elsewhere: aborted: aborted by alice: "
        "the new batch was mislabelled; the champion answers every request"]
    assert controller.step is None
