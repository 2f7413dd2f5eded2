# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""drain_haproxy: parsing of HAProxy 2.6's runtime API answers (recorded from Debian 12's haproxy), the drain/undrain
decisions, and the module against a fake stats socket speaking the same protocol, and against a real haproxy when one
is installed."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_haproxy as hx
from ansible_collections.gpufleet.upgrade.plugins.module_utils._drain import DrainError
from ansible_collections.gpufleet.upgrade.plugins.modules import drain_haproxy

# Recorded from haproxy 2.6.12 (Debian 12): `show servers state serving` with drain-node1 drained (admin 8).
STATE_HEADER = (
    "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state "
    "bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr "
    "srv_agent_addr srv_agent_port"
)
RECORDED_STATE = (
    "1\n" + STATE_HEADER + "\n"
    "3 serving 1 drain-node1 127.0.0.1 2 8 1 1 0 15 3 4 6 0 0 0 - 18081 - 0 0 - - 0\n"
    "3 serving 2 drain-node2 127.0.0.1 0 0 1 1 2 8 2 0 6 0 0 0 - 18082 - 0 0 - - 0\n\n"
)
STAT_HEADER = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,"
    "act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,rate_lim,rate_max,"
    "check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,"
    "req_rate,req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,"
    "qtime,ctime,rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,check_rise,check_fall,"
    "check_health,agent_rise,agent_fall,agent_health,addr,cookie,mode,algo,"
)
# `show stat serving 4 -1` (servers only), drain-node1 draining with one session in flight, drain-node2 down.
RECORDED_STAT = (
    STAT_HEADER + "\n"
    "serving,drain-node1,0,0,1,1,,3,0,0,,0,,0,0,0,0,DRAIN,1,1,0,0,1,1,1,,1,3,1,,0,,2,0,,0,L7OK,200,1,0,0,0,0,0,0,"
    ",,,0,0,0,,,,,-1,,,0,0,0,0,,,,Layer7 check passed,,2,3,4,,,,127.0.0.1:18081,,http,,\n"
    "serving,drain-node2,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN,1,1,0,1,1,11,11,,1,3,2,,0,,2,0,,0,L4CON,,0,0,0,0,0,0,0,"
    ",,,0,0,0,,,,,-1,Connection refused,,0,0,0,0,,,,Layer4 connection problem,,2,3,0,,,,127.0.0.1:18082,,http,,\n\n"
)
RECORDED_SESS = (
    "0x7f15e8046150: proto=tcpv4 src=127.0.0.1:59392 fe=fe be=serving srv=drain-node1 ts=00 epoch=0 age=1s calls=2 "
    "rate=0 cpu=0 lat=0 rq[f=49c40080h,i=0,an=8000h,rx=,wx=,ax=] rp[f=80400000h,i=0,an=1400000h,rx=28s,wx=,ax=]\n"
    "0x7f15e804d6a0: proto=unix_stream src=unix:1 fe=GLOBAL be=<NONE> srv=<none> ts=00 epoch=0 age=0s calls=1\n\n"
)


# --------------------------------------------------------------------------- parsing and decisions


def test_recorded_servers_state_parses_by_header():
    rows = hx.parse_servers_state(RECORDED_STATE)
    assert [(r["srv_name"], r["srv_op_state"], r["srv_admin_state"], r["srv_port"]) for r in rows] == [
        ("drain-node1", "2", "8", "18081"),
        ("drain-node2", "0", "0", "18082"),
    ]


def test_recorded_stat_and_view():
    view = hx.server_view(
        hx.parse_servers_state(RECORDED_STATE), hx.parse_stat(RECORDED_STAT), "serving", "drain-node1"
    )
    assert view == {
        "id": 1,
        "admin": "drain",
        "admin_mask": 8,
        "op_state": "running",
        "status": "DRAIN",
        "sessions": 1,
        "queued": 0,
    }
    down = hx.server_view(
        hx.parse_servers_state(RECORDED_STATE), hx.parse_stat(RECORDED_STAT), "serving", "drain-node2"
    )
    assert (down["admin"], down["op_state"], down["status"], hx.in_rotation(down)) == (
        "ready",
        "stopped",
        "DOWN",
        False,
    )


@pytest.mark.parametrize(
    "text",
    ["Can't find backend.\n\n", "1\n3 serving 1 x 127.0.0.1 2 0\n", ""],
    ids=["error-text", "no-header", "empty"],
)
def test_bad_servers_state_is_an_error(text):
    with pytest.raises(DrainError):
        hx.parse_servers_state(text)


def test_unknown_server_names_the_servers_and_the_fix():
    with pytest.raises(
        DrainError, match=r"no server 'node9' \(servers: drain-node1, drain-node2\).*gpufleet_haproxy_server"
    ):
        hx.server_view(hx.parse_servers_state(RECORDED_STATE), [], "serving", "node9")


@pytest.mark.parametrize(
    ("mask", "state"),
    [
        (0, "ready"),
        (0x08, "drain"),
        (0x10, "drain"),
        (0x01, "maint"),
        (0x09, "maint"),
        (0x04, "maint"),
        (0x40, "ready"),
    ],
)
def test_admin_mask(mask, state):
    assert hx.admin_state(mask) == state


@pytest.mark.parametrize(
    ("want", "current", "ours", "action"),
    [
        ("drained", "ready", False, "drain"),
        ("drained", "drain", True, None),
        ("drained", "drain", False, None),
        ("drained", "maint", False, None),
        ("ready", "drain", True, "ready"),
        ("ready", "maint", True, "ready"),
        ("ready", "ready", True, None),
        ("ready", "drain", False, None),
        ("ready", "maint", False, None),
    ],
)
def test_plan(want, current, ours, action):
    assert hx.plan(want, current, ours)[0] == action


def test_plan_says_an_operators_drain_is_left():
    assert "an operator's choice" in hx.plan("ready", "drain", False)[1]
    assert "before this run" in hx.plan("drained", "maint", False)[1]


def test_set_reply_refusal_is_an_error():
    hx.check_set_reply("\n", "serving", "a", "drain")
    with pytest.raises(DrainError, match="No such server"):
        hx.check_set_reply("No such server.\n\n", "serving", "a", "drain")


def test_sessions_of_keeps_the_servers_streams_only():
    lines = hx.sessions_of(RECORDED_SESS, "serving", "drain-node1")
    assert len(lines) == 1 and lines[0].startswith("0x7f15e8046150: proto=tcpv4")
    assert hx.sessions_of(RECORDED_SESS, "serving", "drain-node") == []


# Recorded from haproxy 2.6.12: a backend `st` with `stick-table type ip ...` and `stick on src`, and the BACKEND row
# of `show stat ck 2 -1` for a backend with `cookie SRV insert indirect nocache` (the header's last fields only).
RECORDED_TABLES = "# table: st, type: ip, size:1024, used:1\n\n"
RECORDED_TABLE_ENTRIES = (
    "# table: st, type: ip, size:1024, used:1\n"
    "0x55d321037580: key=127.0.0.1 use=0 exp=599791 server_id=1 server_key=a\n\n"
)
RECORDED_BACKEND_STAT = "# pxname,svname,scur,status,cookie,mode\nck,BACKEND,0,UP,SRV,http\n\n"


def test_persistence_is_read_from_the_cookie_and_the_backends_stick_table():
    assert hx.backend_cookie(hx.parse_stat(RECORDED_BACKEND_STAT), "ck") == "SRV"
    assert hx.backend_cookie(hx.parse_stat(RECORDED_STAT), "serving") == ""
    assert hx.table_names(RECORDED_TABLES) == ["st"] and hx.table_names("\n") == []
    entries = hx.table_entries(RECORDED_TABLE_ENTRIES)
    assert entries == ["0x55d321037580: key=127.0.0.1 use=0 exp=599791 server_id=1 server_key=a"]
    found = hx.persistence("", "st", entries)
    assert found == {"cookie": "", "stick_table": "st", "stuck": 1, "found": True}
    assert hx.describe_persistence(found) == "stick table st (1 client(s) stuck to the server)"
    assert not hx.persistence("", "", [])["found"]


@pytest.mark.parametrize(
    ("mode", "found", "out"),
    [("move", True, "maint"), ("move", False, "drain"), ("keep", True, "drain"), ("keep", False, "drain")],
)
def test_out_state(mode, found, out):
    assert hx.out_state(mode, hx.persistence("SRV" if found else "", "", [])) == out


@pytest.mark.parametrize(
    ("current", "ours", "action"),
    [("ready", False, "maint"), ("drain", True, "maint"), ("drain", False, None), ("maint", True, None)],
)
def test_plan_with_persistence(current, ours, action):
    assert hx.plan("drained", current, ours, "maint")[0] == action


def test_timeout_in_drain_with_persistence_names_the_fix():
    view = {"admin": "drain", "sessions": 2, "queued": 0}
    msg = hx.timeout_message("n1", "ck", "a", view, 5.0, [], "idle", hx.persistence("SRV", "", []))
    assert "keeps clients on their server (cookie SRV)" in msg and "gpufleet_haproxy_persistence=move" in msg
    assert "gpufleet_haproxy_on_timeout=shutdown" in msg
    plain = hx.timeout_message(
        "n1", "ck", "a", dict(view, admin="maint"), 5.0, [], "idle", hx.persistence("SRV", "", [])
    )
    assert "after 5.0s of maint" in plain and "persistence=move" not in plain


# --------------------------------------------------------------------------- a fake stats socket


class FakeHAProxy:
    """A Unix stats socket answering like haproxy 2.6: one command per connection, then close."""

    def __init__(self, path, servers):
        self.path = str(path)
        self.servers = servers  # name -> {"admin": mask, "op": 0..3, "scur": [values per look]}
        self.commands = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _scur(self, srv):
        values = srv["scur"]
        return values.pop(0) if len(values) > 1 else values[0]

    def answer(self, line):
        words = line.split()
        if line.startswith("show servers state"):
            if words[3:] and words[3] != "serving":
                return "Can't find backend.\n\n"
            rows = [
                f"3 serving {i} {name} 127.0.0.1 {s['op']} {s['admin']} 1 1 0 15 3 4 6 0 0 0 - 1808{i} - 0 0 - - 0"
                for i, (name, s) in enumerate(sorted(self.servers.items()), 1)
            ]
            return "1\n" + STATE_HEADER + "\n" + "\n".join(rows) + "\n\n"
        if line.startswith("show stat"):
            rows = []
            for name, s in sorted(self.servers.items()):
                status = (
                    "MAINT" if s["admin"] & 1 else "DRAIN" if s["admin"] & 8 else ("UP" if s["op"] == 2 else "DOWN")
                )
                rows.append(f"serving,{name},0,0,{self._scur(s)},1,,3,0,0,,0,,0,0,0,0,{status},1,1")
            return STAT_HEADER + "\n" + "\n".join(rows) + "\n\n"
        if line.startswith("show table"):
            return "\n"
        if line == "show sess":
            return RECORDED_SESS.replace("srv=drain-node1 ", "srv=node1 ")
        if words[:2] == ["set", "server"] and words[3:4] == ["state"]:
            backend, _slash, name = words[2].partition("/")
            if backend != "serving":
                return "No such backend.\n\n"
            if name not in self.servers:
                return "No such server.\n\n"
            if words[4] not in ("ready", "drain", "maint"):
                return "'set server <srv> state' expects 'ready', 'drain' and 'maint'.\n\n"
            self.servers[name]["admin"] = {"ready": 0, "drain": 8, "maint": 1}[words[4]]
            return "\n"
        return "Unknown command.\n\n"

    def _serve(self):
        while True:
            try:
                conn = self.sock.accept()[0]
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                line = data.decode().strip()
                self.commands.append(line)
                conn.sendall(self.answer(line).encode())

    def sets(self):
        return [c for c in self.commands if c.startswith("set ")]

    def close(self):
        self.sock.close()


@pytest.fixture
def fake(tmp_path):
    servers = {"node1": {"admin": 0, "op": 2, "scur": [0]}, "node2": {"admin": 0, "op": 2, "scur": [0]}}
    proxy = FakeHAProxy(tmp_path / "admin.sock", servers)
    yield proxy
    proxy.close()


def call(args, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        drain_haproxy.main()
    return info.type is Exit, info.value.args[0]


def args(fake, tmp_path, **extra):
    base = {
        "socket": fake.path,
        "backend": "serving",
        "server": "node1",
        "host": "node1",
        "record_dir": str(tmp_path / "drain"),
        "run_id": "r1",
        "interval_s": 0.01,
        "timeout_s": 2,
    }
    return dict(base, **extra)


def record_file(tmp_path, server="node1"):
    return tmp_path / "drain" / f"haproxy-serving-{server}.json"


def test_drain_waits_for_sessions_then_undrain_puts_back(fake, tmp_path):
    fake.servers["node1"]["scur"] = [2, 2, 1, 0]
    ok, res = call(args(fake, tmp_path))
    assert ok and res["changed"], res
    assert (res["previous"], res["admin_state"], res["sessions"], res["status"]) == ("ready", "drain", 0, "DRAIN")
    assert fake.sets() == ["set server serving/node1 state drain"]
    assert json.loads(record_file(tmp_path).read_text())["run_id"] == "r1"
    again, res2 = call(args(fake, tmp_path))
    assert again and not res2["changed"] and fake.sets() == ["set server serving/node1 state drain"]
    ok, back = call(args(fake, tmp_path, state="ready"))
    assert ok and back["changed"] and back["admin_state"] == "ready" and back["status"] == "UP", back
    assert fake.sets()[-1] == "set server serving/node1 state ready"
    assert not record_file(tmp_path).exists()
    ok, idem = call(args(fake, tmp_path, state="ready"))
    assert ok and not idem["changed"] and len(fake.sets()) == 2


def test_drain_timeout_names_host_sessions_and_fix(fake, tmp_path):
    fake.servers["node1"]["scur"] = [1]
    ok, res = call(args(fake, tmp_path, timeout_s=0.2))
    assert not ok
    assert res["msg"].startswith("node1: HAProxy server serving/node1 still had 1 session(s) in flight")
    assert "0x7f15e8046150: proto=tcpv4 src=127.0.0.1:59392" in res["msg"]
    assert "fix: raise gpufleet_drain_timeout_s" in res["msg"]
    # The drain was sent and recorded: the rollback's undrain finds the record and puts the server back.
    assert record_file(tmp_path).exists() and fake.servers["node1"]["admin"] == 8
    ok, back = call(args(fake, tmp_path, state="ready"))
    assert ok and back["changed"] and fake.servers["node1"]["admin"] == 0


def test_check_mode_reports_and_changes_nothing(fake, tmp_path):
    ok, res = call(args(fake, tmp_path), check=True, diff=True)
    assert ok and res["changed"] and res["admin_state"] == "drain"
    assert res["diff"]["before"] == "serving/node1: ready\n" and res["diff"]["after"] == "serving/node1: drain\n"
    assert fake.sets() == [] and not record_file(tmp_path).exists()
    ok, back = call(args(fake, tmp_path, state="ready"), check=True)
    assert ok and not back["changed"]


def test_an_operators_drain_stays_after_the_run(fake, tmp_path):
    fake.servers["node2"]["admin"] = 8
    ok, res = call(args(fake, tmp_path, server="node2", host="node2"))
    assert ok and not res["changed"] and "before this run" in res["msg"]
    assert not record_file(tmp_path, "node2").exists()
    ok, back = call(args(fake, tmp_path, server="node2", host="node2", state="ready"))
    assert ok and not back["changed"] and back["admin_state"] == "drain" and "operator's choice" in back["msg"]
    assert fake.sets() == []


@pytest.mark.parametrize(("mask", "state"), [(8, "drain"), (1, "maint")])
def test_a_server_found_out_of_rotation_is_refused_unless_told_and_never_put_back(fake, tmp_path, mask, state):
    fake.servers["node2"]["admin"] = mask
    mine = {"server": "node2", "host": "node2"}
    ok, res = call(args(fake, tmp_path, found_drained="refuse", **mine))
    assert not ok and not res["changed"] and res["drained_by"] == "other", res
    assert res["msg"].startswith(
        f"node2: HAProxy server serving/node2 was in {state} before this run, not by gpufleet; it stays so and is"
        " not upgraded (nothing was drained or undrained); fix: set gpufleet_upgrade_drained_hosts=true"
    )
    ok, res = call(args(fake, tmp_path, found_drained="upgrade", **mine))
    assert ok and not res["changed"] and res["drained_by"] == "other"
    ok, back = call(args(fake, tmp_path, state="ready", **mine))
    assert ok and not back["changed"] and back["admin_state"] == state
    assert fake.sets() == [] and fake.servers["node2"]["admin"] == mask and not record_file(tmp_path, "node2").exists()


def test_drained_by_says_who_took_the_server_out(fake, tmp_path):
    assert call(args(fake, tmp_path, found_drained="refuse"))[1]["drained_by"] == "run"
    assert call(args(fake, tmp_path, found_drained="refuse"))[1]["drained_by"] == "gpufleet"
    assert call(args(fake, tmp_path, state="ready"))[1]["drained_by"] == ""


def test_a_killed_runs_drain_is_put_back_by_the_next_run(fake, tmp_path):
    record_file(tmp_path).parent.mkdir(parents=True)
    record_file(tmp_path).write_text(json.dumps({"run_id": "r0", "backend": "serving", "server": "node1"}))
    fake.servers["node1"]["admin"] = 8
    ok, res = call(args(fake, tmp_path))
    assert ok and not res["changed"] and "earlier gpufleet drain" in res["msg"]
    assert res["record"]["run_id"] == "r0"
    ok, back = call(args(fake, tmp_path, state="ready"))
    assert ok and back["changed"] and fake.servers["node1"]["admin"] == 0 and not record_file(tmp_path).exists()


def test_undrain_waits_until_the_health_check_is_up(fake, tmp_path):
    call(args(fake, tmp_path))
    fake.servers["node1"]["op"] = 0
    ok, res = call(args(fake, tmp_path, state="ready", timeout_s=0.2))
    assert not ok and "node1: HAProxy server serving/node1 is ready but its health check says stopped" in res["msg"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"server": "node9"}, "no server 'node9' (servers: node1, node2)"),
        ({"backend": "other"}, "unexpected `show servers state` answer"),
    ],
)
def test_bad_names_fail_with_what_was_seen(fake, tmp_path, extra, message):
    ok, res = call(args(fake, tmp_path, **extra))
    assert not ok and message in res["msg"], res
    assert fake.sets() == []


def test_missing_socket_names_it_and_the_fix(tmp_path):
    ok, res = call({"socket": str(tmp_path / "nope.sock"), "backend": "serving", "server": "n", "host": "node7"})
    assert not ok
    assert res["msg"].startswith("node7: HAProxy's stats socket") and "gpufleet_haproxy_socket" in res["msg"]


# --------------------------------------------------------------------------- a real haproxy


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


@pytest.fixture
def real_haproxy(tmp_path):
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("haproxy is not installed (scripts/setup.sh installs Debian's package)")
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = tmp_path / "admin.sock"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        f"global\n    stats socket {sock} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend serving\n"
        "backend serving\n    option httpchk GET /health\n"
        f"    server node1 127.0.0.1:{backend.server_address[1]} check inter 200ms rise 1 fall 1\n"
    )
    proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
        time.sleep(0.05)
    yield str(sock)
    proc.terminate()
    proc.wait(timeout=10)
    backend.shutdown()


def test_real_haproxy_drain_and_ready(real_haproxy, tmp_path):
    base = {"socket": real_haproxy, "backend": "serving", "server": "node1", "record_dir": str(tmp_path / "rec")}
    ok, res = call(dict(base, timeout_s=10, interval_s=0.1))
    assert ok and res["changed"] and (res["admin_state"], res["status"]) == ("drain", "DRAIN"), res
    raw = hx.Runtime(real_haproxy).command("show servers state serving")
    assert hx.parse_servers_state(raw)[0]["srv_admin_state"] == "8"
    ok, back = call(dict(base, state="ready", timeout_s=10, interval_s=0.1))
    assert (
        ok and back["changed"] and (back["admin_state"], back["op_state"], back["status"]) == ("ready", "running", "UP")
    )
    ok, unknown = call(dict(base, server="node9"))
    assert not ok and "no server 'node9' (servers: node1)" in unknown["msg"]
    assert not os.path.exists(tmp_path / "rec" / "haproxy-serving-node1.json")


# --------------------------------------------------------------------------- a real haproxy with persistence


class _Named(http.server.BaseHTTPRequestHandler):
    """Answers with the server's name; /slow takes SLOW_S (a request still in flight when the drain waits)."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        if self.path == "/slow":
            time.sleep(SLOW_S)
        body = self.server.name.encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *_):
        pass


SLOW_S = 4


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def sticky_haproxy(tmp_path):
    """HAProxy with two servers (a, b) behind two backends: ck (cookie SRV) and st (stick table, stick on src)."""
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("haproxy is not installed (scripts/setup.sh installs Debian's package)")
    servers = {}
    for name in ("a", "b"):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        httpd.name = name
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers[name] = httpd
    ports = {"ck": _free_port(), "st": _free_port()}
    sock = tmp_path / "admin.sock"
    check = "check inter 200ms rise 1 fall 1"
    lines = [
        f"global\n    stats socket {sock} mode 600 level admin",
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 10s\n    timeout server 10s",
    ]
    for backend, port in ports.items():
        lines.append(f"frontend fe_{backend}\n    bind 127.0.0.1:{port}\n    default_backend {backend}")
        persist = (
            "    cookie SRV insert indirect nocache"
            if backend == "ck"
            else "    stick-table type ip size 1k expire 10m\n    stick on src"
        )
        srv = [
            f"    server {n} 127.0.0.1:{h.server_address[1]} {check}" + (f" cookie {n}" if backend == "ck" else "")
            for n, h in servers.items()
        ]
        lines.append(
            f"backend {backend}\n    balance roundrobin\n    option httpchk GET /health\n{persist}\n" + "\n".join(srv)
        )
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    api = hx.Runtime(str(sock))
    deadline = time.monotonic() + 10
    while not sock.exists() or "DOWN" in api.command("show stat -1 4 -1") or "UP" not in api.command("show stat"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
        time.sleep(0.05)
    yield {"socket": str(sock), "ports": ports, "record_dir": str(tmp_path / "rec")}
    proc.terminate()
    proc.wait(timeout=10)
    for httpd in servers.values():
        httpd.shutdown()


def get(port, path="/", cookie=None):
    """One request through HAProxy: (status, body, Set-Cookie). Each on its own connection, closed after it."""
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Cookie": cookie} if cookie else {})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.status, resp.read().decode(), resp.headers.get("Set-Cookie", "")


def sticky_args(h, backend, server, **extra):
    base = {"socket": h["socket"], "backend": backend, "server": server, "host": f"node-{server}"}
    return {**base, "record_dir": h["record_dir"], "run_id": "r1", "timeout_s": 10, "interval_s": 0.1, **extra}


@pytest.fixture
def warnings(monkeypatch):
    """module.warn's record. Once a controller module is imported (as earlier tests in the same run do), warn() goes
    to the controller's display instead of the module's result: the module side is restored for the test."""
    from ansible.module_utils import _internal
    from ansible.module_utils.common import warnings as module_warnings

    monkeypatch.setattr(_internal, "is_controller", False)
    module_warnings._global_warnings.clear()
    return module_warnings


def test_real_cookie_persistence_keep_leaves_clients_move_sends_them_elsewhere(sticky_haproxy, warnings):
    h = sticky_haproxy
    port = h["ports"]["ck"]
    assert get(port, cookie="SRV=a")[1] == "a"
    # keep: HAProxy's own drain. Clients holding a's cookie still reach a: the host would see requests until it stops.
    ok, res = call(sticky_args(h, "ck", "a", persistence="keep"))
    assert ok and res["admin_state"] == "drain" and res["persistence"]["cookie"] == "SRV", res
    assert any("keeps clients on their server (cookie SRV)" in w for w in warnings.get_warning_messages())
    assert [get(port, cookie="SRV=a")[1] for _try in range(3)] == ["a", "a", "a"]
    assert get(port)[1] == "b", "a drained server took a request without a cookie"
    ok, back = call(sticky_args(h, "ck", "a", state="ready"))
    assert ok and back["admin_state"] == "ready" and back["status"] == "UP", back
    # move (the default): maint. The same client goes to b and is handed b's cookie; nothing fails.
    ok, res = call(sticky_args(h, "ck", "a"))
    assert ok and res["changed"] and (res["previous"], res["admin_state"]) == ("ready", "maint"), res
    answers = [get(port, cookie="SRV=a") for _try in range(3)]
    assert {(status, body) for status, body, _cookie in answers} == {(200, "b")}, answers
    assert answers[0][2].startswith("SRV=b"), answers[0]
    ok, back = call(sticky_args(h, "ck", "a", state="ready"))
    assert ok and back["changed"] and (back["admin_state"], back["status"]) == ("ready", "UP"), back
    assert get(port, cookie="SRV=a")[1] == "a"


def test_real_stick_table_entries_of_the_server_are_cleared(sticky_haproxy):
    h = sticky_haproxy
    port = h["ports"]["st"]
    first = get(port)[1]
    other = {"a": "b", "b": "a"}[first]
    assert [get(port)[1] for _try in range(3)] == [first] * 3, "stick on src did not keep the client"
    ok, res = call(sticky_args(h, "st", first), check=True)
    assert ok and res["admin_state"] == "maint" and res["persistence"]["stuck"] == 1, res
    assert "server_id" in hx.Runtime(h["socket"]).command("show table st"), "check mode cleared the table"
    ok, res = call(sticky_args(h, "st", first))
    assert ok and res["admin_state"] == "maint", res
    assert res["persistence"]["stick_table"] == "st" and res["persistence"]["cleared"] == 1, res
    assert [get(port)[1] for _try in range(3)] == [other] * 3
    assert f"server_key={other}" in hx.Runtime(h["socket"]).command("show table st")
    ok, back = call(sticky_args(h, "st", first, state="ready"))
    assert ok and back["admin_state"] == "ready", back


def test_real_on_timeout_shutdown_ends_what_still_runs(sticky_haproxy, warnings):
    h = sticky_haproxy
    port = h["ports"]["ck"]
    outcome = {}

    def slow():
        try:
            outcome["answer"] = get(port, "/slow", cookie="SRV=a")
        except OSError as exc:
            outcome["error"] = exc

    client = threading.Thread(target=slow)
    client.start()
    api = hx.Runtime(h["socket"])
    deadline = time.monotonic() + 5
    while "ck,a,0,0,1," not in api.command("show stat ck 4 -1"):
        assert time.monotonic() < deadline, "the slow request did not reach a"
        time.sleep(0.05)
    ok, res = call(sticky_args(h, "ck", "a", timeout_s=0.5))
    assert not ok and "still had 1 session(s) in flight" in res["msg"] and "of maint" in res["msg"], res
    ok, res = call(sticky_args(h, "ck", "a", timeout_s=0.5, on_timeout="shutdown"))
    assert ok and res["sessions"] == 0 and res["persistence"]["ended"] == 1, res
    assert res["waited_s"] < SLOW_S, res
    assert any("ended 1 session(s) of ck/a" in w for w in warnings.get_warning_messages())
    client.join(timeout=SLOW_S + 5)
    assert "error" in outcome, f"the cut request was answered: {outcome}"


def test_query_reads_every_server_of_the_backend_at_once(fake, tmp_path):
    fake.servers["node1"]["admin"] = 1
    fake.servers["node2"]["op"] = 0
    ok, res = call({"socket": fake.path, "backend": "serving", "state": "query"})
    assert ok and not res["changed"] and fake.sets() == []
    assert res["out_of_service"]["node1"] == "HAProxy maint"
    assert res["out_of_service"]["node2"].startswith("HAProxy health check ")
