# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until a serving unit answers GET /health with 200; give up early when the unit has died.

Usage: python3 wait_healthy.py URL UNIT TIMEOUT_S (the role runs it as python3 -c <this file> URL UNIT TIMEOUT_S).
Prints one JSON line; exit 0 healthy, 2 timeout, 3 unit failed. Healthy, it also says when (``health_monotonic``, the
host's CLOCK_MONOTONIC) and systemd's times of the unit's last stop and start on the same clock (``times``), with the
boot they belong to: the edges of the return to service (plugins/module_utils/_return.py reads them).
Polling the unit's state too is the point: a crashed server is reported at once instead of after the
whole health timeout (which is minutes for a real model).
It polls every 0.1 s for the first 10 s, then every second (poll_intervals): the wait is part of the host's
downtime, and a server that is up within seconds should not lose most of a second to the poll.
"""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,Result,NRestarts,ExecMainStatus"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


RETURN_PROPERTIES = "ActiveExitTimestampMonotonic,InactiveExitTimestampMonotonic,ExecMainStartTimestampMonotonic"


def return_times(unit):
    out = subprocess.run(
        ["systemctl", "show", unit, "--property=" + RETURN_PROPERTIES], capture_output=True, text=True, check=False
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def health(opener, url):
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status == 200, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except Exception as exc:  # connection refused while the server loads is expected
        return False, f"{exc.__class__.__name__}: {getattr(exc, 'reason', exc)}"


def poll_intervals(fast=0.1, fast_for=10.0, slow=1.0):
    """Seconds to sleep before each next poll: ``fast`` for the first ``fast_for`` seconds of sleep, then ``slow``."""
    for _poll in range(round(fast_for / fast)):
        yield fast
    while True:
        yield slow


def main():
    url, unit, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    start = time.monotonic()
    seen = "no answer yet"
    # NRestarts counts over the unit's lifetime: only an increase while we wait means a crash.
    restarts_before = unit_state(unit).get("NRestarts", "0")
    intervals = poll_intervals()
    while True:
        ok, seen = health(opener, url)
        waited = round(time.monotonic() - start, 1)
        if ok:
            answered = time.monotonic()
            print(
                json.dumps(
                    {
                        "healthy": True,
                        "waited_s": waited,
                        "url": url,
                        "health_monotonic": answered,
                        "times": return_times(unit),
                        "boot_id": boot_id(),
                    }
                )
            )
            return 0
        state = unit_state(unit)
        restarting = state.get("SubState") == "auto-restart" or state.get("NRestarts", "0") != restarts_before
        if state.get("ActiveState") in ("failed", "inactive") or restarting:
            print(
                json.dumps(
                    {
                        "healthy": False,
                        "waited_s": waited,
                        "url": url,
                        "unit": state,
                        "reason": f"unit {unit} is {state.get('ActiveState')}/{state.get('SubState')} "
                        f"(result {state.get('Result')}, exit status "
                        f"{state.get('ExecMainStatus')}, restarts {state.get('NRestarts')})",
                    }
                )
            )
            return 3
        if waited >= timeout:
            print(
                json.dumps(
                    {
                        "healthy": False,
                        "waited_s": waited,
                        "url": url,
                        "unit": state,
                        "reason": f"no 200 from {url} within {timeout:g}s (last: {seen})",
                    }
                )
            )
            return 2
        time.sleep(next(intervals))


if __name__ == "__main__":
    sys.exit(main())
