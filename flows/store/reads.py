"""The registry reads a command's checks make before anything starts, without MLflow when
the store is the embedded sqlite one.

Why not ``MlflowClient`` for an embedded store:

- Opening it costs seconds (importing MLflow and building its SQLAlchemy store) where the
  same read with ``sqlite3`` costs milliseconds (docs/performance.md, "Command start-up"),
  and the checks exist so that a typo costs well under the time a Prefect
  server takes to start.
- It writes: MLflow's store creates or upgrades the schema of the database it opens (an
  empty or foreign sqlite file comes back holding MLflow's tables). A check must leave the
  store as it found it, so the database is opened ``mode=ro``.

A remote store is asked through ``MlflowClient`` (its server owns the schema). What an
embedded store is read for, all read-only, by MLflow 3's table and column names:

- ``registered_models.name``: the registered names;
- ``registered_model_aliases (name, alias, version)``: the version at an alias;
- ``model_versions (name, version, run_id)``: that a version exists, and its run;
- ``params (run_uuid, key, value)``: the run's ``n_classes`` and ``input_kind``;
- ``model_version_tags (name, version, key, value)``: the version's tags;
- ``registered_model_tags (name, key, value)``: the model's (champion history, rollout).

A file that is not a readable MLflow database raises :class:`sqlite3.DatabaseError`.
Nothing here imports MLflow at module level, so the command-line parser stays light.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def embedded_database(uri: str) -> Path | None:
    """The sqlite file of an embedded store URI, None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def _read_only(database: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True, timeout=10)


def registered_names(uri: str, name: str, alias: str | None) -> tuple[list[str], bool]:
    """(the registered model names of store ``uri``, sorted; whether ``name`` (and, when
    given, its ``@alias``) exists)."""
    database = embedded_database(uri)
    if database is None:
        return _client_names(uri, name, alias)
    connection = _read_only(database)
    try:
        names = [row[0] for row in connection.execute(
            "SELECT name FROM registered_models ORDER BY name")]
        if name not in names:
            return names, False
        if alias is None:
            return names, True
        found = connection.execute(
            "SELECT 1 FROM registered_model_aliases WHERE name = ? AND alias = ?",
            (name, alias)).fetchone()
        return names, found is not None
    finally:
        connection.close()


def _client_names(uri: str, name: str, alias: str | None) -> tuple[list[str], bool]:
    from mlflow.exceptions import MlflowException

    from flows.store import tracking

    client = tracking.client(uri)
    names = sorted(m.name for m in client.search_registered_models(max_results=1000))
    if name not in names:
        return names, False
    if alias is None:
        return names, True
    try:
        client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return names, False
    return names, True


def version_reads(uri: str, name: str, alias: str | None, version: str | None) -> dict | None:
    """Version ``version`` of ``name`` (or the one at ``@alias``) in store ``uri``: its number,
    its run's ``n_classes`` and ``input_kind`` params and the version's tags, as
    ``{"version", "n_classes", "input_kind", "tags"}``; None when there is no such version."""
    database = embedded_database(uri)
    if database is None:
        return _client_version(uri, name, alias, version)
    connection = _read_only(database)
    try:
        if alias is not None:
            found = connection.execute(
                "SELECT v.version, v.run_id FROM registered_model_aliases a JOIN model_versions"
                " v ON v.name = a.name AND v.version = a.version WHERE a.name = ? AND "
                "a.alias = ?", (name, alias)).fetchone()
        else:
            found = connection.execute(
                "SELECT version, run_id FROM model_versions WHERE name = ? AND version = ?",
                (name, version)).fetchone()
        if found is None:
            return None
        number, run_id = found
        params = dict(connection.execute(
            "SELECT key, value FROM params WHERE run_uuid = ? AND key IN "
            "('n_classes', 'input_kind')", (run_id,)))
        tags = dict(connection.execute(
            "SELECT key, value FROM model_version_tags WHERE name = ? AND version = ?",
            (name, number)))
    finally:
        connection.close()
    return {"version": str(number), "n_classes": params.get("n_classes"),
            "input_kind": params.get("input_kind"), "tags": tags}


def _client_version(uri: str, name: str, alias: str | None,
                    version: str | None) -> dict | None:
    from mlflow.exceptions import MlflowException

    from flows.store import tracking

    client = tracking.client(uri)
    try:
        current = (client.get_model_version_by_alias(name, alias) if alias is not None
                   else client.get_model_version(name, version))
    except MlflowException:
        return None
    params = client.get_run(current.run_id).data.params
    return {"version": str(current.version), "n_classes": params.get("n_classes"),
            "input_kind": params.get("input_kind"), "tags": dict(current.tags)}


def model_state(uri: str, name: str) -> dict | None:
    """Registered model ``name`` of store ``uri`` as its operator commands check it first:
    ``{"aliases": {alias: version}, "versions": {version: tags}, "tags": model tags}``
    (versions as strings), or None when no such model is registered."""
    database = embedded_database(uri)
    if database is None:
        return _client_state(uri, name)
    connection = _read_only(database)
    try:
        if connection.execute("SELECT 1 FROM registered_models WHERE name = ?",
                              (name,)).fetchone() is None:
            return None
        aliases = {alias: str(version) for alias, version in connection.execute(
            "SELECT alias, version FROM registered_model_aliases WHERE name = ?", (name,))}
        versions: dict[str, dict[str, str]] = {
            str(version): {} for (version,) in connection.execute(
                "SELECT version FROM model_versions WHERE name = ? ORDER BY version", (name,))}
        for version, key, value in connection.execute(
                "SELECT version, key, value FROM model_version_tags WHERE name = ?", (name,)):
            versions.setdefault(str(version), {})[key] = value
        tags = dict(connection.execute(
            "SELECT key, value FROM registered_model_tags WHERE name = ?", (name,)))
    finally:
        connection.close()
    return {"aliases": aliases, "versions": versions, "tags": tags}


def _client_state(uri: str, name: str) -> dict | None:
    from mlflow.exceptions import MlflowException

    from flows.store import tracking

    client = tracking.client(uri)
    try:
        model = client.get_registered_model(name)
    except MlflowException:
        return None
    from flows.store.registry import model_versions

    versions = {str(mv.version): dict(mv.tags) for mv in model_versions(client, name)}
    return {"aliases": {alias: str(version) for alias, version in model.aliases.items()},
            "versions": dict(sorted(versions.items(), key=lambda item: int(item[0]))),
            "tags": dict(model.tags)}
