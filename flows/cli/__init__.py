"""The ``cord-ops`` command line: the parser and commands, the operator commands, and the
warm runner's process."""
