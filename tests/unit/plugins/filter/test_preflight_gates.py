# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter preflight_gates: role preflight's one judgement over module preflight_probe's answers. The report lists the
gates in order; each failure names the host, the value seen and the fix; the state file's recovery refuses a host."""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.filter.preflight import preflight_gates

GIB = 1 << 30


def probe(**over):
    answers = {
        "state": {"previous": {}, "recovery": {"action": "none", "reason": "no earlier run recorded"}},
        "python": {"rc": 0, "path": "/usr/bin/python3.12"},
        "disk": {
            "paths": [
                {"path": "/srv/current", "exists": True, "lnk_source": "/srv/venvs/old"},
                {"path": "/usr/local/cuda", "exists": True, "lnk_source": "/usr/local/cuda-12.8"},
                {"path": "/usr/local/cuda-13.0/bin/nvcc", "exists": False, "lnk_source": None},
                {"path": "/srv", "exists": True, "lnk_source": None},
            ],
            "du": [f"{4 * GIB}\t/srv/venvs/old", f"{6 * GIB}\t/usr/local/cuda-12.8"],
            "df": ["Mounted on Avail", f"/ {100 * GIB}", f"/ {100 * GIB}"],
        },
        "drained": {"skipped": True},
        "mirrors": [],
    }
    answers.update(over)
    return answers


def judge(answers, **kw):
    args = {"host": "gpu1", "lock_msg": "taken", "python": "python3.12", "python_version": "3.12", "mirror_urls": []}
    args.update(kw)
    return preflight_gates(answers, **args)


def test_a_ready_host_passes_every_gate_in_the_report_s_order():
    controller = {"results": [{"item": "http://m/simple/", "status": 200}]}
    out = judge(probe(), mirror_urls=["http://m/simple/"], controller_mirrors=controller)
    assert out["failures"] == []
    assert list(out["report"]) == ["lock", "state", "python", "gpu", "disk", "mirrors", "drained"]
    assert out["report"]["lock"] == "ok: taken" and out["report"]["python"] == "ok: /usr/bin/python3.12"
    assert out["report"]["gpu"] == "skipped: no GPU" and out["report"]["mirrors"] == "ok: 1 answered"
    assert out["report"]["drained"] == "not required" and out["report"]["disk"].startswith("ok: ")
    assert out["report"]["state"] == "ok: no earlier run recorded"


def test_every_failed_gate_is_listed_with_the_host_the_value_and_the_fix():
    answers = probe(
        state={"previous": {"run_id": "r0"}, "recovery": {"action": "refuse", "reason": "the last rollback failed"}},
        python={"rc": 127, "path": ""},
        drained={"rc": 3, "stderr": "still serving 12 requests\n"},
        mirrors=[{"url": "http://m/simple/", "status": -1, "msg": "connection refused"}],
    )
    answers["disk"]["df"] = ["Mounted on Avail", f"/ {GIB}", f"/ {GIB}"]
    out = judge(
        answers,
        gpu_required=True,
        nvml={"failed": True, "msg": "libnvidia-ml.so.1 not found"},
        mirror_urls=["http://m/simple/"],
        controller_mirrors={"results": [{"item": "http://m/simple/", "status": 403, "msg": "Forbidden"}]},
        drained_check_cmd="sinfo -n gpu1 -h -o %T | grep -q drained",
    )
    failures = out["failures"]
    assert len(failures) == 7, failures
    assert all(f.startswith("gpu1: ") for f in failures)
    assert failures[0] == "gpu1: the last rollback failed"
    assert out["report"]["state"] == "failed: the last rollback failed"
    assert "python3.12 is not on the host" in failures[1] and "Python 3.12" in failures[1] and "fix:" in failures[1]
    assert "libnvidia-ml.so.1 not found" in failures[2] and "fix: run it by hand" in failures[2]
    assert "GiB free on /" in failures[3] and "fix: free space" in failures[3]
    assert "answered 403 from the controller (Forbidden)" in failures[4]
    assert "answered -1 from the host (connection refused)" in failures[5]
    assert "exited 3 (still serving 12 requests)" in failures[6] and "fix: drain the host first" in failures[6]
    # Each failed gate keeps its own reasons and fix whole (report.json, junit.xml read them), without the host.
    report = out["report"]
    assert report["python"] == "failed: " + failures[1].removeprefix("gpu1: ")
    assert report["gpu"] == "failed: " + failures[2].removeprefix("gpu1: ")
    assert report["disk"] == "failed: " + failures[3].removeprefix("gpu1: ")
    assert report["mirrors"] == "failed: " + "; ".join(f.removeprefix("gpu1: ") for f in failures[4:6])
    assert report["drained"] == "failed: " + failures[6].removeprefix("gpu1: ")


def test_the_gpu_verdict_of_nvml_info_is_recorded_as_it_is():
    gates = {"report": "ok: driver 580.95.05, 8 x sm_90", "failures": []}
    out = judge(probe(), gpu_required=True, nvml={"gates": gates})
    assert out["report"]["gpu"] == gates["report"] and out["failures"] == []
    bad = {"report": "failed", "failures": ["gpu1: driver 550.54 is below 580.65; fix: upgrade the driver"]}
    assert judge(probe(), gpu_required=True, nvml={"failed": True, "gates": bad})["failures"] == bad["failures"]


def test_mirrors_left_out_when_not_checked():
    out = judge(probe(), check_mirrors=False)
    assert "mirrors" not in out["report"] and out["failures"] == []


def test_the_new_venv_is_sized_from_the_lock_when_it_has_installed_sizes():
    lock = {"venv_name": "cu130-abc", "packages": [{"name": "torch", "installed_size": 90 * GIB}], "tools": []}
    out = judge(probe(), lock=lock)
    assert len(out["failures"]) == 1 and "from the lock cu130-abc" in out["failures"][0]
