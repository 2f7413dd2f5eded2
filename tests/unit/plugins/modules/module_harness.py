"""Shared harness of the module unit tests: exit_json / fail_json raise, so a test reads what a module returned."""

from __future__ import annotations


class Exit(Exception):
    """The module called exit_json; args[0] holds its result."""


class Fail(Exception):
    """The module called fail_json; args[0] holds its result."""
