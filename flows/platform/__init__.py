"""What every command stands on: the Prefect servers (temporary and managed) and their
credential, the warm runner, Prefect task presets, named checkpoints (a hook the tests use
for fault injection), progress and tick lines, pinned deployment parameters, the MLflow UI."""
