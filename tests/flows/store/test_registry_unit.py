"""``flows.store.registry`` in the test process on a real embedded store: the
tags a registration, a decision and a completion write, the alias moves, the record of a
failed run, clean-up's report in words, the search filter of names with quotes, and the
paging of logged models and a concurrent create against stand-in clients. The clean-up
and withdrawal scenarios of several owners are in test_registry.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from mlflow.entities import LoggedModelStatus
from mlflow.exceptions import MlflowException

from flows.store import owner, registry


@pytest.fixture
def client(store):
    from mlflow import MlflowClient

    return MlflowClient()


@pytest.fixture(scope="module")
def dead() -> dict:
    """The owner record of a process that ran on this host and has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = owner.Owner(owner.Owner.current().host, child.pid,
                         psutil.Process(child.pid).create_time()).record()
    child.wait()
    return record


def _run(client, name: str, tags: dict):
    experiment = client.get_experiment_by_name(name)
    return client.create_run(experiment.experiment_id if experiment
                             else client.create_experiment(name), tags=tags)


def _register(client, name: str, tags: dict | None = None, previous: str | None = None,
              run_tags: dict | None = None):
    run = _run(client, name, run_tags or owner.Owner.current().record())
    return registry.register_version(client, name, run.info.run_id, str(Path.cwd()), None,
                                     tags or {}, previous)


def _tags(client, name, version) -> dict:
    return client.get_model_version(name, str(version)).tags


def _alias(client, name) -> str | None:
    holder = registry.champion_version(client, name)
    return None if holder is None else str(holder.version)


# ---------------------------------------------------------------- pure
def test_the_name_filter_takes_the_quote_the_name_does_not_hold():
    assert registry.name_filter("digits") == "name = 'digits'"
    assert registry.name_filter("o'brien") == 'name = "o\'brien"'
    assert registry.name_filter('say "hi"') == "name = 'say \"hi\"'"
    assert registry.name_filter("""a'b"c""") == """name LIKE 'a_b"c'"""


# ---------------------------------------------------------------- registration
def test_a_registration_is_pending_and_records_the_champion_of_its_moment(client):
    mv = _register(client, "m", {"cord.input_kind": "logits"}, previous="4")
    assert str(mv.version) == "1" and mv.source == str(Path.cwd())
    assert _tags(client, "m", 1) == {"cord.input_kind": "logits",
                                     registry.REGISTRATION_TAG: registry.PENDING,
                                     registry.PREVIOUS_CHAMPION_TAG: "4"}
    # No champion then: recorded as "" (clean-up then removes the alias).
    _register(client, "m")
    assert _tags(client, "m", 2) == {registry.REGISTRATION_TAG: registry.PENDING,
                                     registry.PREVIOUS_CHAMPION_TAG: ""}


def test_a_retried_registration_returns_the_version_of_its_own_run(client):
    first = _register(client, "m")
    other = _register(client, "m")
    again = registry.register_version(client, "m", first.run_id, str(Path.cwd()), None, {},
                                      None)
    assert str(again.version) == "1" and str(other.version) == "2"
    assert len(registry.model_versions(client, "m")) == 2


def test_model_versions_keep_only_the_exact_name(client):
    # the LIKE filter of a name holding both quotes also matches the name with "_" there
    both, lookalike = """a'b"c""", """a_b"c"""
    _register(client, both)
    _register(client, lookalike)
    _register(client, lookalike)
    assert [mv.name for mv in registry.model_versions(client, both)] == [both]
    assert len(registry.model_versions(client, lookalike)) == 2
    assert registry.model_versions(client, "absent") == []


def test_model_versions_ask_the_store_for_that_name_only():
    # a search without the filter lists every model's versions (up to the page limit)
    asked = []

    class Client:
        def search_model_versions(self, filter_string):
            asked.append(filter_string)
            return [SimpleNamespace(name="m", version="1")]

    assert [mv.version for mv in registry.model_versions(Client(), "m")] == ["1"]
    assert asked == ["name = 'm'"]


def test_a_decision_is_recorded_in_version_tags(client):
    _register(client, "m")
    decision = SimpleNamespace(label="promote", reason="lower NLL", candidate_nll=0.25,
                               champion_nll=0.5, champion_version="3", uncalibrated_nll=0.75,
                               harms=False, promote=True)
    registry.record_decision(client, "m", "1", decision)
    assert _tags(client, "m", 1) == {
        registry.REGISTRATION_TAG: "pending", registry.PREVIOUS_CHAMPION_TAG: "",
        registry.DECISION_TAG: "promote", registry.REASON_TAG: "lower NLL",
        registry.CANDIDATE_NLL_TAG: "0.25", registry.CHAMPION_NLL_TAG: "0.5",
        registry.CHAMPION_VERSION_TAG: "3", registry.UNCALIBRATED_NLL_TAG: "0.75",
        registry.HARMS_TAG: "false"}
    registry.record_decision(client, "m", "1", SimpleNamespace(**{**vars(decision),
                                                                  "harms": True}))
    assert _tags(client, "m", 1)[registry.HARMS_TAG] == "true"


def test_the_alias_moves_only_for_a_promotion_and_completion_is_a_tag(client):
    _register(client, "m")
    _register(client, "m")
    assert registry.champion_version(client, "m") is None
    registry.move_alias(client, "m", "1", SimpleNamespace(promote=True))
    registry.move_alias(client, "m", "2", SimpleNamespace(promote=False))
    assert _alias(client, "m") == "1"
    registry.complete_version(client, "m", "2")
    assert _tags(client, "m", 2)[registry.REGISTRATION_TAG] == registry.COMPLETE
    assert _tags(client, "m", 1)[registry.REGISTRATION_TAG] == registry.PENDING


# ---------------------------------------------------------------- withdrawal and failure
def test_a_withdrawal_leaves_an_alias_it_does_not_hold(client):
    _register(client, "m")
    _register(client, "m")
    client.set_registered_model_alias("m", registry.CHAMPION, "1")
    registry.withdraw_version(client, "m", "2", "1")
    assert _alias(client, "m") == "1"
    assert [str(mv.version) for mv in registry.model_versions(client, "m")] == ["1"]
    # No alias at all: only the version goes.
    client.delete_registered_model_alias("m", registry.CHAMPION)
    registry.withdraw_version(client, "m", "1", None)
    assert registry.model_versions(client, "m") == [] and _alias(client, "m") is None


def test_a_failed_run_withdraws_its_pending_version_and_is_terminated(client):
    _register(client, "m")
    client.set_registered_model_alias("m", registry.CHAMPION, "1")
    failed = _register(client, "m", previous="1")
    client.set_registered_model_alias("m", registry.CHAMPION, "2")
    entry = {"run_id": failed.run_id, "model_name": "m", "version": "2",
             "previous_champion": "1", "error": "x" * 6000}
    registry.record_failure(client, entry)
    assert [str(mv.version) for mv in registry.model_versions(client, "m")] == ["1"]
    assert _alias(client, "m") == "1"
    run = client.get_run(failed.run_id)
    assert run.info.status == "FAILED" and run.data.tags[registry.ERROR_TAG] == "x" * 5000
    registry.record_failure(client, {**entry, "error": "again", "status": "KILLED"})  # twice
    run = client.get_run(failed.run_id)
    assert run.info.status == "KILLED" and run.data.tags[registry.ERROR_TAG] == "again"


def test_a_failure_record_leaves_versions_it_does_not_own(client):
    mine = _run(client, "m", {})
    other = _register(client, "m")  # v1: another run's pending version
    completed = _register(client, "m")  # v2: complete, the failed run's own
    registry.complete_version(client, "m", "2")
    entry = {"model_name": "m", "error": "boom"}
    registry.record_failure(client, {**entry, "run_id": mine.info.run_id, "version": "1"})
    registry.record_failure(client, {**entry, "run_id": completed.run_id, "version": "2"})
    registry.record_failure(client, {**entry, "run_id": mine.info.run_id, "version": "9"})
    assert sorted(str(mv.version) for mv in registry.model_versions(client, "m")) == ["1", "2"]
    assert client.get_run(other.run_id).info.status == "RUNNING"
    assert client.get_run(mine.info.run_id).data.tags[registry.ERROR_TAG] == "boom"
    # A run that is gone (or never reached the store) has nothing to tag.
    registry.record_failure(client, {**entry, "run_id": "0" * 32, "version": None})


def test_an_abandoned_run_is_marked_failed_once(client):
    run = _run(client, "m", {})
    registry.mark_abandoned(client, run, "abandoned: why")
    assert client.get_run(run.info.run_id).data.tags[registry.ERROR_TAG] == "abandoned: why"
    registry.mark_abandoned(client, client.get_run(run.info.run_id), "not again")
    again = client.get_run(run.info.run_id)
    assert again.info.status == "FAILED" and again.data.tags[registry.ERROR_TAG] == (
        "abandoned: why")
    registry.mark_abandoned(client, None, "no run")  # nothing to mark


def test_lookups_of_what_is_not_there_give_none(client):
    assert registry._run_or_none(client, None) is None
    assert registry._run_or_none(client, "") is None
    assert registry._run_or_none(client, "0" * 32) is None
    run = _run(client, "m", {})
    assert registry._run_or_none(client, run.info.run_id).info.run_id == run.info.run_id
    assert registry.champion_version(client, "m") is None
    _register(client, "m")
    assert registry._version_exists(client, "m", "1")
    assert not registry._version_exists(client, "m", "2")


# ---------------------------------------------------------------- clean-up in words
def test_clean_up_reports_each_thing_it_undid(client, dead):
    champion = _register(client, "m", run_tags=dead)  # v1: a finished, complete champion
    client.set_terminated(champion.run_id, "FINISHED")
    registry.complete_version(client, "m", "1")
    client.set_registered_model_alias("m", registry.CHAMPION, "1")
    _register(client, "m", run_tags=dead, previous="1")  # v2: dead, held the alias
    client.set_registered_model_alias("m", registry.CHAMPION, "2")
    _register(client, "m", run_tags=dead, previous="1")  # v3: dead, not the champion
    experiment = client.get_experiment_by_name("m").experiment_id
    abandoned = client.create_run(experiment, tags=dead)
    model = client.create_logged_model(experiment, source_run_id=abandoned.info.run_id)
    who = owner.Owner.from_record(dead).describe()

    done = registry.clean_up(client, "m", experiment)

    # (versions in the store's order: newest first)
    assert done == ["deleted pending v3 of a dead run",
                    "@champion moved back from abandoned v2 to v1",
                    "deleted pending v2 of a dead run",
                    f"marked abandoned run {abandoned.info.run_id} FAILED",
                    f"marked pending logged model {model.model_id} FAILED"]
    assert _alias(client, "m") == "1"
    assert client.get_run(abandoned.info.run_id).data.tags[registry.ERROR_TAG] == (
        f"abandoned: its process ({who}) is gone")
    v2_run = [r for r in client.search_runs([experiment]) if r.data.tags.get(
        registry.ERROR_TAG, "").endswith("v2 was pending; the version was withdrawn by "
                                         "clean-up")]
    assert len(v2_run) == 1 and v2_run[0].info.status == "FAILED"
    assert registry.clean_up(client, "m", experiment) == []


def test_clean_up_removes_an_alias_with_nowhere_to_go_back_to(client, dead):
    _register(client, "m", run_tags=dead, previous="7")  # a champion since deleted
    client.set_registered_model_alias("m", registry.CHAMPION, "1")
    _register(client, "n", run_tags=dead)  # no champion before it
    client.set_registered_model_alias("n", registry.CHAMPION, "1")
    stray = _run(client, "m", dead)  # a dead RUNNING run of the experiment
    # Without an experiment only versions are looked at: the stray run stays.
    assert registry.clean_up(client, "m", None) == ["@champion removed from abandoned v1",
                                                    "deleted pending v1 of a dead run"]
    assert registry.clean_up(client, "n", None) == ["@champion removed from abandoned v1",
                                                    "deleted pending v1 of a dead run"]
    assert _alias(client, "m") is None and _alias(client, "n") is None
    assert client.get_run(stray.info.run_id).info.status == "RUNNING"


def test_clean_up_looks_past_a_completed_version_to_older_pending_ones(client, dead):
    _register(client, "m", run_tags=dead)  # v1: dead, pending
    _register(client, "m")  # v2: complete, listed first by the store (newest first)
    registry.complete_version(client, "m", "2")
    assert registry.clean_up(client, "m", None) == ["deleted pending v1 of a dead run"]
    assert [str(mv.version) for mv in registry.model_versions(client, "m")] == ["2"]


def test_an_abandoned_run_without_an_owner_record_says_so(client):
    experiment = client.create_experiment("m")
    # no owner tags, started long ago: dead by its start time
    run = client.create_run(experiment, start_time=1000)
    assert registry.clean_up(client, "m", experiment) == [
        f"marked abandoned run {run.info.run_id} FAILED"]
    assert client.get_run(run.info.run_id).data.tags[registry.ERROR_TAG] == (
        "abandoned: its process (unknown) is gone")


# ---------------------------------------------------------------- stand-in clients
class Page(list):
    def __init__(self, models, token):
        super().__init__(models)
        self.token = token


def test_pending_logged_models_are_gathered_over_every_page():
    pending = [SimpleNamespace(status=LoggedModelStatus.PENDING, id=i) for i in range(3)]
    ready = SimpleNamespace(status=LoggedModelStatus.READY, id="ready")
    pages = {None: Page([pending[0], ready], "p2"), "p2": Page([pending[1]], "p3"),
             "p3": Page([pending[2]], "")}
    asked = []

    class Client:
        def search_logged_models(self, experiment_ids, page_token=None):
            asked.append((experiment_ids, page_token))
            return pages[page_token]

    assert registry._pending_logged_models(Client(), "7") == pending
    assert asked == [(["7"], None), (["7"], "p2"), (["7"], "p3")]


def test_a_registered_model_created_meanwhile_by_another_run_is_no_error():
    calls = []

    class Client:
        def __init__(self, exists):
            self.exists = exists

        def get_registered_model(self, name):
            calls.append(("get", name))
            if not self.exists:
                raise MlflowException(f"Registered Model with name={name} not found")

        def create_registered_model(self, name):
            calls.append(("create", name))
            self.exists = True  # another run's create won
            raise MlflowException(f"Registered Model (name={name}) already exists")

    registry.ensure_registered_model(Client(False), "m")
    assert calls == [("get", "m"), ("create", "m"), ("get", "m")]
    calls.clear()
    registry.ensure_registered_model(Client(True), "m")
    assert calls == [("get", "m")]
