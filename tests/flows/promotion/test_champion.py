"""``flows.gate``'s registry side on a real embedded MLflow store, in one test so the
store is set up once: the health
tag is written only when it changes, the champion history is append-only, capped and
survives a garbled tag, and a champion that reads another input kind, or whose artifact
cannot run, comes back with the problem instead of an NLL."""

from __future__ import annotations

import json

import numpy as np

from flows.promotion import champion, rules
from flows.store import registry


def test_health_history_and_unscorable_champions(store):
    from mlflow import MlflowClient

    client = MlflowClient()
    name = "gate-store"
    client.create_registered_model(name)

    def tags():
        return client.get_registered_model(name).tags

    # Health: "ok" or the problem; unchanged values are not rewritten.
    champion.record_health(client, name, "3", None)
    assert tags()[champion.HEALTH_TAG] == "ok"
    champion.record_health(client, name, "3", "graph missing")
    assert tags()[champion.HEALTH_TAG] == "v3 cannot be scored: graph missing"
    client.set_registered_model_tag(name, champion.HEALTH_TAG, "set by hand")
    champion.record_health(client, name, "3", "graph missing")
    assert tags()[champion.HEALTH_TAG] == "v3 cannot be scored: graph missing"

    # History: [] before anything, rows appended oldest first, compact JSON, capped at 50.
    assert champion.read_history(client, name) == []
    champion.push_history(client, name, {"version": "1", "how": "gate"})
    champion.push_history(client, name, {"version": "2", "from": "1", "how": "gate"})
    assert champion.read_history(client, name) == [{"version": "1", "how": "gate"},
                                               {"version": "2", "from": "1", "how": "gate"}]
    assert tags()[champion.HISTORY_TAG] == ('[{"version":"1","how":"gate"},'
                                        '{"version":"2","from":"1","how":"gate"}]')
    champion.write_history(client, name, [{"version": str(v)} for v in range(60)])
    kept = champion.read_history(client, name)
    assert [h["version"] for h in kept] == [str(v) for v in range(10, 60)]
    # Garbled, not a list, or rows without a version: what can be read, never an error.
    for raw, expected in (("{oops", []), ('{"version": "1"}', []),
                          ('[{"version": "4"}, 7, {"how": "gate"}]', [{"version": "4"}])):
        client.set_registered_model_tag(name, champion.HISTORY_TAG, raw)
        assert champion.read_history(client, name) == expected
    champion.push_history(client, name, {"version": "5"})
    assert json.loads(tags()[champion.HISTORY_TAG]) == [{"version": "4"}, {"version": "5"}]

    # Scoring a champion: none, another input kind, an artifact that cannot run.
    scores, labels = np.full((4, 3), 1 / 3), np.array([0, 1, 2, 0])
    assert champion.score_champion(client, name, None, scores, labels, "probs") is None
    assert champion.champion_reference(client, name, None, 3, "probs") == (None, None)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    version = client.create_model_version(name, f"runs:/{run.info.run_id}/model",
                                          run.info.run_id)
    client.set_model_version_tag(name, version.version, registry.INPUT_KIND_TAG, "logits")
    assert champion.score_champion(client, name, version.version, scores, labels, "probs") == \
        rules.ChampionScore(version.version, None, "it reads logits, this split holds probs")
    client.set_model_version_tag(name, version.version, registry.INPUT_KIND_TAG, "probs")
    broken = champion.score_champion(client, name, version.version, scores, labels, "probs")
    assert broken.version == version.version and broken.nll is None
    # in words, as the error line prints it: why nothing was loaded, no exception class name
    assert broken.problem == (f"v{version.version}: its run {run.info.run_id} recorded no "
                              "digests (run tag cord.artifacts.sha256), so its graph cannot "
                              "be checked; it is not loaded"), broken.problem
    assert not broken.problem.split(":")[0].endswith(("Exception", "Error"))
    split, why = champion.champion_reference(client, name, version.version, 3, "probs")
    assert split is None and why.startswith("unavailable: ")
