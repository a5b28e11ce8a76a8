"""docs/admin-guide.md runs: its shell blocks of sections 1 to 8, in order, as root, against a Slurm cluster of
the test's own (``scripts/slurm-test-cluster.sh``: two nodes, the session cluster's release, ports 60/100
above it), a real Prometheus and a real Alertmanager.

The guide's paths are mapped into the test's directory and ports (``path_map``, the one place that says
how); nothing is run under the machine's own /etc, /var/lib or /usr. A block the lab cannot run is marked
in the guide (``<!-- guide-test: KEY: what it lacks -->``) and replaced by the equivalent ``SUBSTITUTES``
states for that key; an unknown key fails, no block is skipped. The service's user ``healthd`` is
``nobody`` here (the lab cannot add users to the machine).

Then the runbooks' commands (every ``healthd ...`` line of docs/alerts.md, ``NODE`` the node an admin drained
by hand) run against that daemon: none is a usage error or a crash, and healthd refuses to drain or undrain
a node drained by someone else.

Done when (issue 38): a running service, Prometheus scraping it with the rules loaded, the Epilog running
the node check, ``healthd doctor`` exiting 0, ``healthd status`` as root showing the service's nodes,
and the service still writing its store afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.conftest import CLUSTER_SCRIPT, REPO, SlurmTestCluster
from tests.integration.daemons import free_port, get
from tests.unit.test_docs_commands import command_lines

GUIDE = REPO / "docs" / "admin-guide.md"
END = "<!-- guide-test: end -->"
_MARK = re.compile(r"^<!-- guide-test: (?P<key>[a-z-]+): (?P<why>.+) -->$")
SERVICE_USER, SERVICE_GROUP = "nobody", "nogroup"
NODES = ("node1", "node2")
LAB_CLASSES = [{"name": "tgpux2", "gpu_type": "tgpu", "expect_gpus": 0}]
"""The lab's GRES are character devices, not GPUs: the node-class rule a site writes for such GRES."""


@dataclass(frozen=True)
class Block:
    line: int
    text: str
    key: str | None = None
    why: str = ""


def guide_blocks() -> list[Block]:
    """The ``sh`` blocks before ``END``, each with the mark on the line before it, if any."""
    lines = GUIDE.read_text().splitlines()
    assert END in lines, f"{GUIDE.name} has no {END!r}"
    blocks: list[Block] = []
    mark: re.Match[str] | None = None
    i = 0
    while lines[i] != END:
        line = lines[i]
        if line.startswith("<!-- guide-test:"):
            mark = _MARK.match(line)
            assert mark is not None, f"{GUIDE.name}:{i + 1}: a malformed mark: {line}"
            assert lines[i + 1] == "```sh", f"{GUIDE.name}:{i + 1}: a mark not followed by a sh block"
        elif line == "```sh":
            end = lines.index("```", i + 1)
            blocks.append(Block(i + 1, "\n".join(lines[i + 1:end]) + "\n", mark["key"] if mark else None,
                                mark["why"] if mark else ""))
            mark, i = None, end
        i += 1
    return blocks


@dataclass
class Lab:
    root: Path
    env: dict[str, str]
    slurm_conf: Path
    ports: dict[str, int]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def path_map(self) -> list[tuple[str, str]]:
        """The guide's paths and addresses -> the lab's, applied in this order."""
        venv_bin = str(Path(sys.executable).parent)
        r = str(self.root)
        return [
            ("/opt/healthd/bin/", f"{venv_bin}/"),
            ("/shared/healthd/venv/bin/python", sys.executable),
            ("/usr/local/bin/healthd", f"{r}/usr/local/bin/healthd"),
            ("/etc/slurm/slurm.conf", str(self.slurm_conf)),
            ("RebootProgram=/usr/sbin/reboot", "RebootProgram=/bin/true"),  # never this machine's reboot
            ("-o healthd -g healthd", f"-o {SERVICE_USER} -g {SERVICE_GROUP}"),
            *((p, f"{r}{p}") for p in ("/etc/healthd", "/var/lib/healthd", "/usr/libexec/healthd", "/usr/share/healthd",
                                       "/shared/healthd", "/etc/prometheus", "/etc/grafana", "/var/lib/grafana")),
            ("localhost:9469", f"127.0.0.1:{self.ports['healthd']}"),
            ("localhost:9090", f"127.0.0.1:{self.ports['prometheus']}"),
            ("localhost:9093", f"127.0.0.1:{self.ports['alertmanager']}"),
        ]

    def mapped(self, text: str) -> str:
        for guide, lab in self.path_map():
            text = text.replace(guide, lab)
        return re.sub(r"--prefix /(?=\s|$)", f"--prefix {self.root}/", text)

    def sh(self, text: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", text], env=self.env, cwd=self.root,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with log.open("ab") as out:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               env=env or self.env, cwd=self.root, start_new_session=True))

    def wait(self, what: str, check: Callable[[], object], timeout: float = 60) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                assert p.poll() is None, f"{p.args} exited:\n{self.tails()}"
            try:
                if value := check():
                    return value
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}:\n{self.tails()}")

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-2000:]}" for log in self.logs)

    def api(self, port: int, path: str) -> object:
        status, body = get(port, path)
        assert status == 200, body
        return json.loads(body)["data"]


def _use_the_checkouts_venv(lab: Lab, block: Block) -> None:
    """pip: this checkout's virtualenv stands for /opt/healthd (``path_map``); it has healthd installed."""
    assert subprocess.run([sys.executable, "-m", "healthd.cli", "--version"], capture_output=True, timeout=60,
                          check=False).returncode == 0


def _systemd(lab: Lab, block: Block) -> None:
    """systemd: each systemctl/systemd-* line of the block, as the unit or the package would do it."""
    for line in block.text.strip().splitlines():
        SYSTEMD_LINES[line.strip()](lab)


def _sysusers_tmpfiles(lab: Lab) -> None:
    """healthd.tmpfiles' two directories, 0750, owned by the service's user (sysusers: nobody stands for it)."""
    done = lab.sh(f"install -d -o {SERVICE_USER} -g {SERVICE_GROUP} -m 0750 {lab.root}/var/lib/healthd "
                  f"{lab.root}/var/lib/healthd/results")
    assert done.returncode == 0, done.stderr


def _start_healthd(lab: Lab) -> None:
    """The unit: ExecStartPre check-config and ExecStart run, as User=healthd (nobody), with StateDirectory=
    (STATE_DIRECTORY) and the config it names; Type=notify: started once /healthz answers and the nodes
    are discovered. The lab's additions, through the environment: a free port on 127.0.0.1, the lab's
    node-class rule, the scheduled probes off (their jobs would keep the lab's two CPU cores busy; this
    guide sets up the node check)."""
    env = {**lab.env, "STATE_DIRECTORY": f"{lab.root}/var/lib/healthd", "HEALTHD_HTTP__HOST": "127.0.0.1",
           "HEALTHD_HTTP__PORT": str(lab.ports["healthd"]), "HEALTHD_SLURM__NODE_CLASSES": json.dumps(LAB_CLASSES),
           "HEALTHD_PROBES__GEMM__ENABLED": "false", "HEALTHD_PROBES__NCCL__ENABLED": "false"}
    as_service = ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_GROUP}", "--init-groups"]
    config = f"{lab.root}/etc/healthd/healthd.toml"
    healthd = str(Path(sys.executable).parent / "healthd")
    pre = subprocess.run([*as_service, healthd, "check-config", "--config", config], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert pre.returncode == 0, pre.stderr
    lab.start("healthd", [*as_service, healthd, "run", "--config", config], env)
    lab.wait("healthd's /api/v1/nodes to list the lab's nodes",
             lambda: {n["name"] for n in json.loads(get(lab.ports["healthd"], "/api/v1/nodes")[1])["nodes"]}
             >= set(NODES), timeout=90)


def _reload_prometheus(lab: Lab) -> None:
    """The unit's reload: SIGHUP to Prometheus; then its rules are loaded and it scrapes healthd."""
    lab.procs[0].send_signal(signal.SIGHUP)
    port = lab.ports["prometheus"]
    lab.wait("Prometheus to load healthd's rules", lambda: lab.api(port, "/api/v1/rules")["groups"])  # type: ignore[index]
    lab.wait("Prometheus to scrape healthd",
             lambda: lab.api(port, "/api/v1/query?query=healthd_build_info")["result"])  # type: ignore[index]


def _start_alertmanager(lab: Lab) -> None:
    """The Debian unit's ExecStart with this file, on the port localhost:9093 stands for; then Prometheus
    lists it as an active Alertmanager."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert binary, "prometheus-alertmanager is not installed (scripts/test.sh installs it)"
    lab.start("alertmanager", [binary, f"--config.file={lab.root}/etc/prometheus/alertmanager.yml",
                               f"--web.listen-address=127.0.0.1:{lab.ports['alertmanager']}",
                               "--cluster.listen-address=", f"--storage.path={lab.root}/alertmanager"])
    lab.wait("Prometheus to find the Alertmanager", lambda: lab.api(
        lab.ports["prometheus"], "/api/v1/alertmanagers")["activeAlertmanagers"])  # type: ignore[index]


def _grafana_would_load(lab: Lab) -> None:
    """What Grafana's file provider loads at its restart: the provider's ``path`` (read from the installed
    provisioning file) holds the three dashboards, each JSON with a uid and panels."""
    provider = (lab.root / "etc/grafana/provisioning/dashboards/healthd.yml").read_text()
    path = Path(lab.mapped(re.search(r"^\s+path: (\S+)$", provider, re.MULTILINE)[1]))  # type: ignore[index]
    dashboards = {p.name: json.loads(p.read_text()) for p in path.glob("*.json")}
    assert set(dashboards) == {"healthd-fleet.json", "healthd-node.json", "healthd-probes.json"}
    assert all(d["uid"] and d["panels"] for d in dashboards.values())


SYSTEMD_LINES: dict[str, Callable[[Lab], None]] = {
    "systemd-sysusers && systemd-tmpfiles --create": _sysusers_tmpfiles,
    "systemctl enable --now healthd": _start_healthd,
    "systemctl reload prometheus": _reload_prometheus,
    "systemctl restart prometheus-alertmanager": _start_alertmanager,
}


def _nothing_to_do(lab: Lab, block: Block) -> None:
    """The mark says why the lab needs nothing in its place."""


SUBSTITUTES: dict[str, Callable[[Lab, Block], None]] = {
    "pip": _use_the_checkouts_venv,
    "systemd": _systemd,
    "slurmdbd": _nothing_to_do,
    "copy": _nothing_to_do,
    "grafana": lambda lab, block: _grafana_would_load(lab),
}


def test_every_mark_has_its_substitute() -> None:
    blocks = guide_blocks()
    assert len(blocks) >= 12
    marked = [b for b in blocks if b.key]
    assert {b.key for b in marked} <= set(SUBSTITUTES), [b.key for b in marked]
    for b in marked:
        if b.key == "systemd":
            assert all(line.strip() in SYSTEMD_LINES for line in b.text.strip().splitlines()), b
    assert [b.line for b in blocks if "healthd doctor" in b.text], "the guide ends with healthd doctor"


@pytest.fixture
def lab(slurm_cluster: SlurmTestCluster) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the guide runs as root (and the lab cluster's daemons need it)")
    sinfo = shutil.which("sinfo", path=slurm_cluster.env.get("PATH"))
    if sinfo is not None and (Path(sinfo).parent / ".enter").exists():
        pytest.skip("a chroot release: its Slurm commands are wrappers that need root (unshare), which the "
                    "service's user is not; the guide runs against the host's Slurm")
    if shutil.which("prometheus") is None or shutil.which("promtool") is None or shutil.which("amtool") is None:
        pytest.skip("prometheus/promtool/amtool not installed (Debian packages prometheus, prometheus-alertmanager)")
    root = Path(tempfile.mkdtemp(prefix="hd-guide-", dir="/tmp"))
    root.chmod(0o755)
    ctld = int(slurm_cluster.env.get("HEALTHD_SLURM_CTLD_PORT", "16817")) + 60
    node = int(slurm_cluster.env.get("HEALTHD_SLURM_NODE_PORT", "17001")) + 100
    env = {k: v for k, v in slurm_cluster.env.items()
           if not k.startswith("HEALTHD_") or k in ("HEALTHD_SLURM_RELEASE", "HEALTHD_VENV")}
    env.update(HEALTHD_SLURM_DIR=str(root / "slurm"), HEALTHD_SLURM_CTLD_PORT=str(ctld),
               HEALTHD_SLURM_NODE_PORT=str(node), HEALTHD_SLURM_NODES=str(len(NODES)),
               SLURM_CONF=str(root / "slurm" / "etc" / "slurm.conf"),
               HEALTHD_SERVICE_CONFIG=str(root / "etc/healthd/healthd.toml"),
               HEALTHD_SERVICE_STATE_DIR=str(root / "var/lib/healthd"),
               PATH=f"{root}/usr/local/bin:{env['PATH']}")
    env.pop("HEALTHD_CONFIG", None)
    started = subprocess.run([str(CLUSTER_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    lab = Lab(root, env, root / "slurm" / "etc" / "slurm.conf",
              {"healthd": free_port(), "prometheus": free_port(), "alertmanager": free_port()})
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        (root / "usr/local/bin").mkdir(parents=True)
        prometheus_yml = root / "etc/prometheus/prometheus.yml"  # the site's Prometheus, before the guide
        prometheus_yml.parent.mkdir(parents=True)
        prometheus_yml.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n")
        lab.start("prometheus", [str(shutil.which("prometheus")), f"--config.file={prometheus_yml}",
                                 f"--storage.tsdb.path={root / 'tsdb'}", "--log.level=warn",
                                 f"--web.listen-address=127.0.0.1:{lab.ports['prometheus']}"])
        yield lab
    finally:
        for p in reversed(lab.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        subprocess.run([str(CLUSTER_SCRIPT), "stop"], env=env, capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)


def boundary_runs(lab: Lab) -> dict[str, float]:
    from healthd.http import nodes_document
    from healthd.store import Store

    store = Store(lab.root / "var/lib/healthd/healthd.sqlite", read_only=True)
    try:
        doc = nodes_document(store.snapshot(), None)
    finally:
        store.close()
    return {n["name"]: n["probes"]["boundary"]["last_run_at"] for n in doc["nodes"] if "boundary" in n["probes"]}


@pytest.mark.slurm
def test_the_admin_guide_runs(lab: Lab) -> None:
    t0 = time.monotonic()
    outputs: dict[int, str] = {}
    for block in guide_blocks():
        print(f"\n== {GUIDE.name}:{block.line} ({time.monotonic() - t0:.0f} s)"
              + (f" substituted ({block.key}: {block.why})" if block.key else ""))
        if block.key:
            SUBSTITUTES[block.key](lab, block)
            continue
        if "healthd doctor" in block.text:  # "a minute later": the Epilogs end, the daemon collects
            text = lab.mapped(block.text)
            done = lab.wait("healthd doctor to find nothing to fix",
                            lambda text=text: (d := lab.sh(text)).returncode == 0 and d, timeout=150)
        else:
            done = lab.sh(lab.mapped(block.text))
        assert isinstance(done, subprocess.CompletedProcess)
        assert done.returncode == 0, f"{GUIDE.name}:{block.line}:\n{lab.mapped(block.text)}\n{done.stdout}\n" \
                                     f"{done.stderr}\n{lab.tails()}"
        outputs[block.line] = done.stdout
    print(f"the guide ran in {time.monotonic() - t0:.0f} s")

    doctor, status = outputs[max(outputs)].split("all good\n")
    assert "[ ok] prometheus scrape" in doctor and "[ ok] prometheus rules" in doctor
    assert "[ ok] node check: all 2 nodes left boundary documents" in doctor
    assert "[ ok] topology: topology/tree" in doctor
    assert all(f"{n}  state=" in status for n in NODES), status
    state = lab.root / "var/lib/healthd"
    assert {p.stat().st_uid for p in state.rglob("*")} == {lab.root.joinpath("var/lib/healthd").stat().st_uid}
    assert not [n for n in NODES if "drain" in lab.sh(f"sinfo -h -n {n} -o %T").stdout], "a node check drained"

    before = boundary_runs(lab)
    assert set(before) == set(NODES)
    again = lab.sh("srun -w node1 -N1 true")
    assert again.returncode == 0, again.stderr
    lab.wait("the service to store node1's next documents (it still writes)",
             lambda: boundary_runs(lab).get("node1", 0) > before["node1"], timeout=90)
    check_runbooks(lab)


RUNBOOK_NOT_RUN = {
    "healthd probe nccl": "a probe on the admin node itself (the runbook says so: what not to type mid-incident)",
    "healthd ha init": "writes the schema into a two-node site's database; this lab has [ha] off, where it is "
                       "refused (tests/integration/test_ha_mariadb.py runs it against a real MariaDB)",
}


def runbook_commands() -> list[str]:
    """The ``healthd ...`` lines of docs/alerts.md, ``NODE`` made node2, install-files under the lab's prefix."""
    lines = []
    for line in command_lines():
        text = line.text.replace("NODE", "node2")
        if not line.where.startswith("docs/alerts.md") or text in RUNBOOK_NOT_RUN or text in lines:
            continue
        lines.append(text)
    return lines


def run_runbooks(lab: Lab) -> dict[str, subprocess.CompletedProcess[str]]:
    drained = lab.sh('scontrol update nodename=node2 state=drain reason="disk swap (admin)"')
    assert drained.returncode == 0, drained.stderr
    done = {}
    for text in runbook_commands():
        argv = lab.mapped(text) + (f" --prefix {lab.root}/" if "install-files" in text else "")
        if "probe" in text and "--node" in text:
            argv += " --timeout 60"
        done[text] = result = lab.sh(argv, timeout=120)
        print(f"runbook: {text}: exit {result.returncode}")
        assert result.returncode in (0, 1), f"{text}: exit {result.returncode}\n{result.stderr}"
        assert "Traceback" not in result.stderr, f"{text}:\n{result.stderr}"
    return done


def check_runbooks(lab: Lab) -> None:
    """The runbooks' commands against the guide's daemon, with node2 drained by an admin (one cluster and one
    daemon for both: the lab's start is most of the time)."""
    done = run_runbooks(lab)
    assert {"healthd status", "healthd recommend", "healthd drain node2", "healthd undrain node2",
            "healthd probe nccl --node node2", "healthd doctor", "healthd check-config"} <= done.keys()
    assert "drain node2: refused:" in done["healthd drain node2"].stdout
    assert "undrain node2: refused:" in done["healthd undrain node2"].stdout
    probe = done["healthd probe nccl --node node2"]
    assert probe.returncode == 1 and "node2" in probe.stdout, probe.stdout + probe.stderr
    assert "node2" in lab.sh("sinfo -h -t drain -N -o %N").stdout  # still the admin's drain
    audit = lab.sh(lab.mapped("healthd audit"))
    assert audit.stdout.count("refused") >= 2, audit.stdout
    state = lab.root / "var/lib/healthd"  # root's drain, undrain and probe --node ran as the service's user
    assert {p.stat().st_uid for p in state.rglob("*")} == {state.stat().st_uid}
