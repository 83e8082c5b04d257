"""Process infrastructure: Prefect task presets and API URL, the temporary and managed
Prefect servers, the warm runner, progress on stderr, fault injection for tests."""
