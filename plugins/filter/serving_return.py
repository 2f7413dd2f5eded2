# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter serving_return: role serving's fact of a return to service, from its /health wait's output.

Documented in ``serving_return.yml`` beside this file; the logic is ``plugins/module_utils/_return.py``.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _return


def serving_return(wait_stdout, returned=False):
    try:
        wait = json.loads(wait_stdout) if isinstance(wait_stdout, str) else wait_stdout
    except ValueError as exc:
        raise AnsibleFilterError(f"gpufleet.upgrade.serving_return: the /health wait printed no JSON: {exc}") from exc
    return _return.serving_return(wait, bool(returned))


class FilterModule:
    def filters(self):
        return {"serving_return": serving_return}
