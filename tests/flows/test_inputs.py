"""One port rule for the command line and the library (flows.inputs.listen_port): 1-65535,
the same error line from ``cord-ops ui``, ``cord-ops serve`` and flows.serve.app."""

from __future__ import annotations

import pytest

from flows import inputs
from flows.cli.main import main
from flows.serve import app


@pytest.mark.parametrize("port", [1, 8080, 65535])
def test_a_port_clients_can_reach_is_accepted(port):
    assert inputs.listen_port(port) == port
    assert app.check_options(port, 1.0, 0.0, 1) is None


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_a_port_outside_1_to_65535_is_refused_in_one_line_everywhere(port, tmp_path,
                                                                       monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = f"--port: expected 1-65535, got {port}"
    with pytest.raises(inputs.InputError) as refused:
        inputs.listen_port(port)
    assert str(refused.value) == line
    with pytest.raises(ValueError) as refused:
        app.check_options(port, 1.0, 0.0, 1)
    assert str(refused.value) == line
    for command in (["ui"], ["serve", "--model-name", "m"]):
        assert main([*command, "--port", str(port)]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {line}"
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
