"""Process infrastructure: Prefect task presets and API URL, the temporary and managed
Prefect servers, the warm runner, progress on stderr, the flow's named checkpoints (a hook
the tests use for fault injection)."""
