"""Module unit tests: every AnsibleModule's exit_json / fail_json raise Exit / Fail (module_harness.py)."""

from __future__ import annotations

import pytest
from ansible.module_utils import basic
from module_harness import Exit, Fail


@pytest.fixture(autouse=True)
def raising(monkeypatch):
    def exit_json(self, **kwargs):
        raise Exit(kwargs)

    def fail_json(self, **kwargs):
        raise Fail(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
