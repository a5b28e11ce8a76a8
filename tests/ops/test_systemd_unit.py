"""systemd/healthd.service, healthd.sysusers and healthd.tmpfiles, checked with systemd's own tools.

- ``systemd-analyze verify`` (any output fails) and ``systemd-analyze security --offline=yes``
  (exposure at most 2.0, and exactly the documented items left open).
- ``systemd-sysusers`` and ``systemd-tmpfiles --create`` applied to a scratch root directory.
- The slow tests run the real daemon, and torch workloads, inside an emulation of the unit's
  sandbox (there is no PID-1 systemd here to run the unit itself): a private mount namespace with
  ``ProtectSystem=strict`` (``/`` read-only, the state directory writable), ``PrivateTmp=``,
  ``ProtectProc=``/``ProcSubset=`` (a fresh /proc mount), an empty capability bounding set with
  ``NoNewPrivileges=``, and the unit's seccomp options rebuilt with libseccomp the way systemd 252
  builds them: ``SystemCallFilter=`` from this host's ``systemd-analyze syscall-filter`` groups
  (plus the implicit ``@default``), ``SystemCallErrorNumber=``, ``MemoryDenyWriteExecute=``
  (src/shared/seccomp-util.c rules) and ``RestrictAddressFamilies=``. Not emulated: ``User=``
  (the test runs as root without capabilities), ``PrivateDevices=``, ``ProtectKernel*=``.
  Each hardening option the unit leaves off is shown to break a workload when switched on.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "healthd.service"
SYSUSERS = REPO / "systemd" / "healthd.sysusers"
TMPFILES = REPO / "systemd" / "healthd.tmpfiles"
INSTALLED_HEALTHD = "/opt/healthd/bin/healthd"
VENV_HEALTHD = Path(sys.executable).with_name("healthd")

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)"
)

# What `systemd-analyze security` leaves open, and why (keep in step with the unit's header).
EXPECTED_OPEN = {
    "RootDirectory=/RootImage=": "the daemon runs the host's Slurm clients",
    "MemoryDenyWriteExecute=": "torch's oneDNN JIT needs W+X pages",
    "RestrictAddressFamilies=~AF_NETLINK": "gloo's getifaddrs()",
    "RestrictAddressFamilies=~AF_UNIX": "munge socket, sd_notify",
    "RestrictAddressFamilies=~AF_(INET|INET6)": "slurmctld, HTTP /metrics",
    "ProcSubset=": "torch needs /proc/cpuinfo to pick its vector kernels",
    "PrivateNetwork=": "slurmctld, HTTP /metrics",
    "PrivateUsers=": "untested against munge/Slurm",
    "DeviceAllow=": "char-rtc:r, which ProtectClock= adds",
    "IPAddressDeny=": "site-specific (a drop-in)",
    "UMask=": "0027: results readable by the healthd group",
}


# -- parsing ---------------------------------------------------------------------------------

def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections → key → values in order (keys may repeat). Comments and blank lines are skipped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"line {number}: not a key=value in a section: {raw!r}"
        assert not value.endswith("\\"), f"line {number}: continuation lines are not used here"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service() -> dict[str, list[str]]:
    return parse_unit(UNIT.read_text())["Service"]


def one(values: dict[str, list[str]], key: str) -> str:
    assert key in values, f"{key}= is missing"
    assert len(values[key]) == 1, f"{key}= is set {len(values[key])} times"
    return values[key][0]


def seconds(timespan: str) -> float:
    match = re.fullmatch(r"(\d+)\s*(ms|s|min|h)?", timespan)
    assert match, f"unsupported time span {timespan!r}"
    return int(match.group(1)) * {"ms": 0.001, "s": 1.0, None: 1.0, "min": 60.0, "h": 3600.0}[match.group(2)]


def installed_copy(directory: Path, executable: Path | str) -> Path:
    """The unit with its ExecStart=/ExecStartPre=/ExecReload= program replaced by one that exists here."""
    lines = UNIT.read_text().splitlines(keepends=True)
    changed = 0
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("#") and INSTALLED_HEALTHD in line:
            lines[i] = line.replace(INSTALLED_HEALTHD, str(executable))
            changed += 1
    assert changed == 3, f"expected ExecStartPre, ExecStart and one ExecReload on {INSTALLED_HEALTHD}, got {changed}"
    copy = directory / "healthd.service"
    copy.write_text("".join(lines))
    return copy


# -- the unit's contract (pure) -------------------------------------------------------------

def test_unit_declares_the_service_contract() -> None:
    svc = service()
    assert one(svc, "Type") == "notify"
    assert one(svc, "NotifyAccess") == "main"
    assert seconds(one(svc, "WatchdogSec")) > 0
    assert one(svc, "Restart") == "on-failure"
    assert one(svc, "User") == one(svc, "Group") == "healthd"
    assert "DynamicUser" not in svc
    assert one(svc, "StateDirectory") == "healthd"
    assert one(svc, "ConfigurationDirectory") == "healthd"
    assert one(svc, "ProtectSystem") == "strict"
    assert one(svc, "NoNewPrivileges") == "yes"
    assert one(svc, "CapabilityBoundingSet") == ""
    assert one(svc, "SystemCallErrorNumber") == "EPERM"
    assert svc["ExecReload"][-1] == "/bin/kill -HUP $MAINPID"
    assert "AF_UNIX" in one(svc, "RestrictAddressFamilies").split()  # munge's socket, sd_notify
    assert "PrivateNetwork" not in svc


def test_exec_lines_are_valid_healthd_command_lines() -> None:
    from healthd.cli import build_parser

    svc = service()
    parser = build_parser()
    commands = {}
    for key in ("ExecStartPre", "ExecStart", "ExecReload"):
        for value in svc[key]:
            argv = shlex.split(value)
            if argv[0] != INSTALLED_HEALTHD:
                continue
            args = parser.parse_args(argv[1:])
            commands[key] = (args.command, args.config)
    assert commands == {
        "ExecStartPre": ("check-config", "/etc/healthd/healthd.toml"),
        "ExecStart": ("run", "/etc/healthd/healthd.toml"),
        "ExecReload": ("check-config", "/etc/healthd/healthd.toml"),
    }


def test_stop_timeout_leaves_room_for_the_daemons_own_deadline() -> None:
    from healthd.daemon import STOP_DEADLINE_S

    svc = service()
    assert seconds(one(svc, "TimeoutStopSec")) >= STOP_DEADLINE_S + 10
    assert one(svc, "KillMode") == "mixed"


def test_user_and_directories_agree_with_sysusers_and_tmpfiles() -> None:
    svc = service()
    users = [line.split() for line in SYSUSERS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(users) == 1
    kind, name, uid = users[0][:3]
    home, shell = users[0][-2:]
    assert (kind, name, uid) == ("u", one(svc, "User"), "-")
    state = "/var/lib/" + one(svc, "StateDirectory")
    assert (home, shell) == (state, "/usr/sbin/nologin")
    lines = [line.split() for line in TMPFILES.read_text().splitlines() if line.strip() and not line.startswith("#")]
    entries = {parts[1]: parts for parts in lines}
    assert entries[state][:5] == ["d", state, one(svc, "StateDirectoryMode"), name, name]
    assert entries[f"{state}/results"][:5] == ["d", f"{state}/results", "0750", name, name]


# -- systemd's own checks --------------------------------------------------------------------

def executable_here() -> Path:
    return VENV_HEALTHD if VENV_HEALTHD.exists() else Path(sys.executable)


@needs_systemd_analyze
def test_systemd_analyze_verify_is_silent(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    copy = installed_copy(tmp_path, executable_here())
    result = subprocess.run([SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@needs_systemd_analyze
def test_systemd_analyze_verify_catches_a_missing_program(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    copy = installed_copy(tmp_path, tmp_path / "not-installed" / "healthd")
    result = subprocess.run([SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode != 0
    assert "not-installed/healthd" in result.stderr


@needs_systemd_analyze
def test_security_exposure_is_at_most_2(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    copy = installed_copy(tmp_path, executable_here())
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=20", "--no-pager", str(copy)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"Overall exposure level for healthd\.service: (\d+\.\d+) (\w+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) <= 2.0
    assert match.group(2) == "OK"
    open_items = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("✗")}
    assert open_items == set(EXPECTED_OPEN), (
        f"newly open: {sorted(open_items - set(EXPECTED_OPEN))}; now closed: {sorted(set(EXPECTED_OPEN) - open_items)}"
    )


# -- sysusers.d and tmpfiles.d ----------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown in a scratch root, mount namespaces)")


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    if shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None:
        pytest.skip("systemd-sysusers/systemd-tmpfiles are not installed (apt-get install systemd)")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    result = subprocess.run(["systemd-sysusers", f"--root={root}", str(SYSUSERS)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return root


@needs_root
def test_sysusers_creates_a_locked_system_user(scratch_root: Path) -> None:
    passwd = [line.split(":") for line in (scratch_root / "etc/passwd").read_text().splitlines()]
    group = [line.split(":") for line in (scratch_root / "etc/group").read_text().splitlines()]
    (user,) = [p for p in passwd if p[0] == "healthd"]
    (grp,) = [g for g in group if g[0] == "healthd"]
    uid, gid = int(user[2]), int(user[3])
    assert 0 < uid < 1000, "a system UID"
    assert gid == int(grp[2]) == uid
    assert user[4:] == ["healthd GPU cluster health monitor", "/var/lib/healthd", "/usr/sbin/nologin"]
    shadow = [line.split(":") for line in (scratch_root / "etc/shadow").read_text().splitlines()]
    (entry,) = [s for s in shadow if s[0] == "healthd"]
    assert entry[1] in ("!*", "!", "*"), "the account cannot log in with a password"


@needs_root
def test_tmpfiles_creates_the_state_tree(scratch_root: Path) -> None:
    uid = next(int(line.split(":")[2]) for line in (scratch_root / "etc/passwd").read_text().splitlines()
               if line.startswith("healthd:"))
    result = subprocess.run(["systemd-tmpfiles", f"--root={scratch_root}", "--create", str(TMPFILES)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    for path in ("var/lib/healthd", "var/lib/healthd/results"):
        st = (scratch_root / path).stat()
        assert (oct(st.st_mode & 0o7777), st.st_uid, st.st_gid) == (oct(0o750), uid, uid), path
    result = subprocess.run(["systemd-tmpfiles", f"--root={scratch_root}", "--clean", str(TMPFILES)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (0, "")


# -- the unit's sandbox, emulated -------------------------------------------------------------

SECCOMP_LOADER = r'''
import errno, json, os, sys
import seccomp as S
cfg = json.load(open(sys.argv[1]))
if cfg["families"] is not None:
    f = S.SyscallFilter(defaction=S.ALLOW)
    for af in range(cfg["af_max"]):
        if af not in cfg["families"]:
            f.add_rule(S.ERRNO(errno.EAFNOSUPPORT), "socket", S.Arg(0, S.EQ, af))
    f.add_rule(S.ERRNO(errno.EAFNOSUPPORT), "socket", S.Arg(0, S.GE, cfg["af_max"]))
    f.load()
if cfg["mdwe"]:
    W, X, SHM_EXEC = 2, 4, 0o100000
    f = S.SyscallFilter(defaction=S.ALLOW)
    f.add_rule(S.ERRNO(errno.EPERM), "mmap", S.Arg(2, S.MASKED_EQ, W | X, W | X))
    f.add_rule(S.ERRNO(errno.EPERM), "mprotect", S.Arg(2, S.MASKED_EQ, X, X))
    f.add_rule(S.ERRNO(errno.EPERM), "pkey_mprotect", S.Arg(2, S.MASKED_EQ, X, X))
    f.add_rule(S.ERRNO(errno.EPERM), "shmat", S.Arg(2, S.MASKED_EQ, SHM_EXEC, SHM_EXEC))
    f.load()
if cfg["allowed"] is not None:  # last, as systemd does: it blocks seccomp() itself
    f = S.SyscallFilter(defaction=S.ERRNO(cfg["errno"]) if cfg["errno"] else S.KILL_PROCESS)
    for name in cfg["allowed"]:
        try:
            f.add_rule(S.ALLOW, name)
        except (RuntimeError, ValueError):
            pass  # not a system call on this architecture
    f.load()
for key in [k for k in os.environ if k.startswith("SBX_")]:
    del os.environ[key]
os.execvp(sys.argv[2], sys.argv[2:])
'''

MOUNT_SETUP = r'''
set -e
mount -t proc -o "$SBX_PROC" proc /proc
if [ -n "$SBX_KEEP" ]; then mkdir -p "$SBX_KEEP_AT"; mount --bind "$SBX_KEEP" "$SBX_KEEP_AT"; fi
if [ "$SBX_PRIVATE_TMP" = 1 ]; then mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp; fi
if [ -n "$SBX_KEEP" ] && [ ! -d "$SBX_KEEP" ]; then mkdir -p "$SBX_KEEP"; mount --bind "$SBX_KEEP_AT" "$SBX_KEEP"; fi
for d in $SBX_WRITABLE; do mount --bind "$d" "$d"; done
if [ "$SBX_STRICT" = 1 ]; then mount -o remount,bind,ro /; fi
exec setpriv $SBX_SETPRIV /usr/bin/python3 "$SBX_LOADER" "$SBX_CONFIG" "$@"
'''

SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mount namespaces)"
    for tool in ("unshare", "setpriv", "systemd-analyze"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(["/usr/bin/python3", "-c", "import seccomp"], capture_output=True, check=False)
    if probe.returncode != 0:
        return "libseccomp's Python binding is not installed (apt-get install python3-seccomp)"
    return None


needs_sandbox = pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable()))


def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif line.startswith("    ") and not line.strip().startswith("#") and current is not None:
            current.append(line.strip())
        elif not line.strip() or line.startswith("#"):
            current = None
    return groups


def expand(groups: dict[str, list[str]], items: list[str]) -> set[str]:
    names: set[str] = set()
    for item in items:
        names |= expand(groups, groups[item]) if item.startswith("@") else {item}
    return names


@dataclass
class Sandbox:
    """The unit's [Service] sandboxing, applied to a command on this host (see the module docstring)."""

    svc: dict[str, list[str]]
    workdir: Path
    writable: list[Path] = field(default_factory=list)

    def _seccomp_config(self) -> dict[str, object]:
        svc = self.svc
        allowed: set[str] | None = None
        groups = syscall_groups()
        for value in svc.get("SystemCallFilter", []):
            deny = value.startswith("~")
            items = value.lstrip("~").split()
            if allowed is None:
                assert not deny, "only allow-list filters are emulated"
                allowed = expand(groups, ["@default"])
            allowed = allowed - expand(groups, items) if deny else allowed | expand(groups, items)
        error = svc.get("SystemCallErrorNumber", [""])[-1]
        families = svc.get("RestrictAddressFamilies", [None])[-1]
        return {
            "allowed": sorted(allowed) if allowed is not None else None,
            "errno": getattr(errno, error) if error else 0,
            "mdwe": svc.get("MemoryDenyWriteExecute", ["no"])[-1] == "yes",
            "families": sorted(getattr(socket, f) for f in families.split()) if families else None,
            "af_max": 46,
        }

    def command(self, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        svc = self.svc
        loader = self.workdir / "seccomp_loader.py"
        loader.write_text(SECCOMP_LOADER)
        config = self.workdir / "seccomp.json"
        config.write_text(json.dumps(self._seccomp_config()))
        proc = ["hidepid=" + svc.get("ProtectProc", ["default"])[-1]]
        if svc.get("ProcSubset", ["all"])[-1] == "pid":
            proc.append("subset=pid")
        private_tmp = svc.get("PrivateTmp", ["no"])[-1] == "yes"
        for path in [self.workdir, *self.writable]:
            assert not (private_tmp and path.is_relative_to("/tmp")), f"{path} would be hidden by PrivateTmp="
        setpriv = []
        if svc.get("NoNewPrivileges", ["no"])[-1] == "yes":
            setpriv.append("--no-new-privs")
        if svc.get("CapabilityBoundingSet", [None])[-1] == "":
            setpriv += ["--bounding-set=-all", "--inh-caps=-all"]
        # The installed daemon lives in /opt/healthd; a checkout under /tmp (a CI clone) stands in for
        # it and must stay visible under PrivateTmp=, as /opt would be.
        keep = REPO if private_tmp and REPO.is_relative_to("/tmp") else None
        env = {
            "SBX_KEEP": str(keep) if keep else "",
            "SBX_KEEP_AT": str(self.workdir / "keep-install"),
            "SBX_PROC": ",".join(proc),
            "SBX_PRIVATE_TMP": "1" if private_tmp else "0",
            "SBX_WRITABLE": " ".join(str(p) for p in [self.workdir, *self.writable]),
            "SBX_STRICT": "1" if svc.get("ProtectSystem", ["no"])[-1] == "strict" else "0",
            "SBX_SETPRIV": " ".join(setpriv),
            "SBX_LOADER": str(loader),
            "SBX_CONFIG": str(config),
            "PATH": SYSTEMD_PATH,
            "LANG": "C.UTF-8",
        }
        for value in svc.get("Environment", []):
            for assignment in shlex.split(value):
                key, _, val = assignment.partition("=")
                env[key] = val
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_SETUP, "sh", *argv], env


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="healthd-unit-", dir="/var/tmp"))  # outside /tmp: PrivateTmp= hides it
    yield path
    shutil.rmtree(path, ignore_errors=True)


BF16_MATMUL = """
import torch
a = torch.randn(256, 256, dtype=torch.bfloat16)
print("bf16 matmul", float((a @ a).float().abs().sum()) > 0)
"""
GLOO_ALL_REDUCE = """
import socket, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(4); dist.all_reduce(t); print("gloo all_reduce", t.tolist())
dist.destroy_process_group()
"""
CPU_CAPABILITY = """
import os, torch
capability = torch.backends.cpu.get_cpu_capability()
expected = os.environ["HOST_CPU_CAPABILITY"]
assert capability == expected, f"torch CPU capability {capability}, but {expected} outside the sandbox"
print("capability", capability)
"""


@functools.cache
def host_cpu_capability() -> str:
    result = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                            capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.strip().splitlines()[-1]


WORKLOADS = {"bf16": BF16_MATMUL, "gloo": GLOO_ALL_REDUCE, "cpu": CPU_CAPABILITY}


def run_in_sandbox(svc: dict[str, list[str]], workdir: Path, script: str) -> subprocess.CompletedProcess[str]:
    argv, env = Sandbox(svc, workdir).command([sys.executable, "-c", script])
    env["HOME"] = str(workdir)
    env["PYTHONPATH"] = str(REPO)
    if "HOST_CPU_CAPABILITY" in script:
        env["HOST_CPU_CAPABILITY"] = host_cpu_capability()
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=workdir)


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_torch_workloads_run_under_the_units_sandbox(workload: str, workdir: Path) -> None:
    result = run_in_sandbox(service(), workdir, WORKLOADS[workload])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Error in cpuinfo" not in result.stderr


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize(
    ("setting", "value", "workload", "symptoms"),
    [
        ("MemoryDenyWriteExecute", "yes", "bf16", ["could not create a primitive"]),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6", "gloo", ["Address family not supported"]),
        ("ProcSubset", "pid", "cpu", ["Error in cpuinfo", "outside the sandbox"]),
        ("SystemCallErrorNumber", "", "bf16", ["killed by SIGSYS"]),
    ],
)
def test_each_hardening_left_off_breaks_a_workload(
    setting: str, value: str, workload: str, symptoms: list[str], workdir: Path
) -> None:
    if workload == "cpu" and host_cpu_capability() == "DEFAULT":
        pytest.skip("torch uses no vector kernels on this CPU, so there is nothing for it to lose")
    if setting == "MemoryDenyWriteExecute" and not host_cpu_capability().startswith("AVX512"):
        pytest.skip(f"torch's bf16 matmul takes oneDNN's JIT (W+X pages) only with AVX-512; this CPU has "
                    f"{host_cpu_capability()}, so there is nothing for MemoryDenyWriteExecute to break here")
    svc = {**service(), setting: [value]}
    result = run_in_sandbox(svc, workdir, WORKLOADS[workload])
    assert result.returncode != 0
    output = result.stderr + (" killed by SIGSYS" if result.returncode == -signal.SIGSYS else "")
    for symptom in symptoms:
        assert symptom in output, output[-3000:]


# -- the real daemon inside the sandbox, talking sd_notify -------------------------------------

class NotifyListener:
    """The manager's notification socket: records (sender pid, message) like systemd does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        size = struct.calcsize("3i")
        while not self._stop.is_set():
            try:
                data, ancdata, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(size))
            except TimeoutError:
                continue
            pid = next(struct.unpack("3i", d[:size])[0] for level, kind, d in ancdata
                       if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS)
            with self._lock:
                self.messages.append((pid, data.decode()))

    def wait_for(self, predicate: object, after: int, timeout: float, what: str, log: Path) -> int:
        """Index of the first message after ``after`` that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for i in range(after, len(self.messages)):
                    if predicate(self.messages[i][1]):  # type: ignore[operator]
                        return i
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout} s; got {self.messages}\nlog:\n{log.read_text()[-4000:]}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def http_get(port: int, path: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def daemon_config(path: Path, state: Path, port: int) -> None:
    path.write_text(f"""
backend = "local"
state_dir = "{state}"
[http]
host = "127.0.0.1"
port = {port}
[scheduler]
discover_interval_s = 2
plan_interval_s = 1
collect_interval_s = 0.5
[local]
node_name = "unitnode"
python = "{sys.executable}"
ranks = 2
[probes.gemm]
interval_s = 3600
timeout_s = 150
[probes.nccl]
interval_s = 3600
timeout_s = 150
[logging]
format = "json"
""")


def pass_count(metrics: str, probe: str) -> float:
    prefix = f'healthd_probe_runs_total{{outcome="pass",probe="{probe}"}} '
    return sum(float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix))


@pytest.mark.slow
@needs_sandbox
def test_daemon_lifecycle_under_the_units_sandbox(workdir: Path) -> None:
    """ExecStartPre, READY, probes passing, WATCHDOG, reload (good and bad config), STOPPING, exit 0."""
    assert VENV_HEALTHD.exists(), f"{VENV_HEALTHD}: install the package into the venv (pip install -e .)"
    svc = service()
    state, confdir = workdir / "state", workdir / "etc"
    state.mkdir()
    confdir.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = confdir / "healthd.toml"
    daemon_config(config, state, port)
    listener = NotifyListener(workdir / "notify")
    sandbox = Sandbox(svc, workdir, writable=[state])
    environment = {"HOME": str(state), "STATE_DIRECTORY": str(state), "CONFIGURATION_DIRECTORY": str(confdir)}

    def exec_line(key: str, index: int = 0) -> list[str]:
        argv = shlex.split(svc[key][index].replace("/etc/healthd/healthd.toml", str(config)))
        return [str(VENV_HEALTHD) if a == INSTALLED_HEALTHD else a for a in argv]

    def run(key: str) -> subprocess.CompletedProcess[str]:
        argv, env = sandbox.command(exec_line(key))
        return subprocess.run(argv, env={**env, **environment}, capture_output=True, text=True, timeout=120,
                              check=False)

    pre = run("ExecStartPre")
    assert pre.returncode == 0, pre.stderr
    assert "config OK" in pre.stdout

    argv, env = sandbox.command(exec_line("ExecStart"))
    env.update(environment, NOTIFY_SOCKET=str(listener.path),
               WATCHDOG_USEC=str(int(seconds(one(svc, "WatchdogSec")) * 1_000_000)))
    log = workdir / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = listener.wait_for(lambda m: m.startswith("READY=1"), 0, 90, "READY=1", log)
        assert http_get(port, "/healthz")[0] == 200

        deadline = time.monotonic() + 300
        metrics = ""
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-4000:]
            metrics = http_get(port, "/metrics")[1]
            if pass_count(metrics, "gemm") >= 1 and pass_count(metrics, "nccl") >= 1:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"gemm and nccl did not pass in the sandbox\n{metrics[-3000:]}\n"
                                 f"{log.read_text()[-4000:]}\n" + "\n".join(
                                     p.read_text()[-2000:] for p in (state / "results").glob("*.log")))
        listener.wait_for(lambda m: m == "WATCHDOG=1", ready, 30, "WATCHDOG=1", log)

        assert run("ExecReload").returncode == 0  # the check-config step of ExecReload=
        mark = len(listener.messages)
        os.kill(proc.pid, signal.SIGHUP)
        reloading = listener.wait_for(lambda m: m.startswith("RELOADING=1\nMONOTONIC_USEC="), mark, 30,
                                      "RELOADING=1", log)
        listener.wait_for(lambda m: m.startswith("READY=1"), reloading, 30, "READY=1 after the reload", log)

        config.write_text(config.read_text() + "\n[unknown_section]\n")
        bad = run("ExecReload")
        assert bad.returncode == 2, bad.stdout + bad.stderr  # systemctl reload fails here, before the HUP
        mark = len(listener.messages)
        os.kill(proc.pid, signal.SIGHUP)  # the daemon itself refuses it too
        reloading = listener.wait_for(lambda m: m.startswith("RELOADING=1"), mark, 30, "RELOADING=1", log)
        listener.wait_for(lambda m: m.startswith("READY=1") and "refused" in m, reloading, 30,
                          "READY=1 with a refusal status", log)
        assert proc.poll() is None
        assert http_get(port, "/healthz")[0] == 200

        mark = len(listener.messages)
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=seconds(one(svc, "TimeoutStopSec"))) == 0, log.read_text()[-4000:]
        assert time.monotonic() - started < 10
        listener.wait_for(lambda m: m.startswith("STOPPING=1"), mark, 5, "STOPPING=1", log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()
    senders = {pid for pid, _ in listener.messages}
    assert senders == {proc.pid}, f"NotifyAccess=main would drop messages from {senders - {proc.pid}}"
