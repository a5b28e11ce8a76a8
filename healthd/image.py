"""The probe image (docs/containers.md): one root filesystem built offline, written three ways.

The root is Debian (``mmdebstrap --variant=minbase`` with ``python3``, from a Debian mirror), the
dependencies of ``healthd[probes]`` with a pinned CPU torch (pip, from the registries pip is set up
with), and the healthd wheel built from this checkout. It is built as two layers so that a change
of healthd's code does not rebuild Debian and torch:

* the **base** layer (Debian, python3, every dependency), cached under ``cache/base-<key>/`` and
  keyed by the hash of its recipe (suite, mirror, packages, torch spec, healthd's declared
  dependencies); built once per machine;
  It holds enroot's ``/etc/rc`` and ``/etc/environment`` and a ``.pth`` naming ``/healthd/site-packages``;
* the **healthd** layer: the wheel's ``healthd`` and ``probes`` packages in ``/healthd/site-packages``,
  keyed by the hash of the files that go into the wheel. Being one new top-level directory, it is
  appended to the cached base ``.sqsh`` (``mksquashfs`` appends at the root only) instead of squashing
  the whole root again.

``build_image(out)`` writes ``out/bundle/`` (``config.json`` + ``rootfs/``, an OCI runtime bundle
for crun and Slurm's ``srun --container``), ``out/healthd-probe.sqsh`` (enroot's image format:
SquashFS with ``/etc/rc`` and ``/etc/environment``; also what ``ch-run`` runs) and
``out/healthd-probe.oci.tar`` (an OCI image archive for ``podman load``, ``apptainer build
… oci-archive:`` and ``enroot import``), and ``out/healthd-probe.json``, the record of what was
built (keys, image digest: the sha256 of the OCI manifest, sizes, build seconds). When that record
already names the same keys, nothing is rebuilt.

``image_problems`` (pure) says what an image's file list lacks for ``python -m probes``;
``image_files`` lists the files of a directory, ``.sqsh`` or OCI archive image.

This module is one of the few that do I/O: it runs mmdebstrap, pip, tar and mksquashfs (argv
lists, each with a timeout) and writes the outputs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from healthd import process
from healthd.errors import ImageError

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_CACHE = Path("/var/cache/healthd-image")
DEFAULT_TORCH = "torch==2.13.0"
BASE_PACKAGES = ("python3",)
RECIPE_VERSION = "2"
IMAGE_PYTHON = "python3.11"
"""Debian bookworm's python3: the wheels pip picks for the host's 3.11 fit it (cp311)."""
SITE_PACKAGES = f"usr/local/lib/{IMAGE_PYTHON}/dist-packages"
"""Where pip installs the dependencies into the root: on Debian python3's ``sys.path``."""
HEALTHD_TOP = "healthd"
HEALTHD_SITE = f"{HEALTHD_TOP}/site-packages"
"""The healthd layer's packages (``/healthd/site-packages``), on ``sys.path`` through ``PTH_FILE``."""
PTH_FILE = f"{SITE_PACKAGES}/healthd-image.pth"
IMAGE_NAME = "healthd-probe"
BUNDLE_DIR = "bundle"
SQSH_FILE = f"{IMAGE_NAME}.sqsh"
OCI_ARCHIVE_FILE = f"{IMAGE_NAME}.oci.tar"
RECORD_FILE = f"{IMAGE_NAME}.json"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_ENV: tuple[tuple[str, str], ...] = (
    ("PATH", IMAGE_PATH),
    ("LANG", "C.UTF-8"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
)
"""The image's environment: OCI config ``Env``, the bundle's ``process.env``, ``/etc/environment``.
No byte-code is written: the root is read-only in every runtime healthd renders."""
ENROOT_RC = """\
# enroot's entry point (NVIDIA/enroot doc/image-format.md): run the command given, else a shell.
if [ $# -gt 0 ]; then
    exec "$@"
else
    exec /bin/sh
fi
"""
SQUASH_OPTIONS = ("-comp", "lzo", "-noD")
"""Data blocks stored uncompressed (torch's libraries barely compress; this keeps the build short)."""
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
_MMDEBSTRAP_TIMEOUT_S = 1800.0
_PIP_TIMEOUT_S = 1800.0
_TAR_TIMEOUT_S = 900.0

REQUIRED_MODULES = ("probes", "torch", "pydantic", "numpy")
"""What ``python -m probes`` imports from the image (``probes`` may instead be mounted, see
``healthd.jobs.Launcher.probes_dir``)."""
MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class BuildRecord:
    """What ``build_image`` wrote (``out/healthd-probe.json``)."""

    base_key: str
    healthd_key: str
    digest: str
    """``sha256:…`` of the OCI manifest: the image's digest as podman and registries name it."""
    torch: str
    suite: str
    base_seconds: float
    """Seconds spent building the base layer in this call (0 when it came from the cache)."""
    seconds: float
    """Seconds of the whole call."""
    sizes: Mapping[str, int]
    """Bytes: ``rootfs`` (apparent size of the tree), ``sqsh`` and ``oci`` (the files)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class BuildInputs:
    source: Path
    """A checkout of healthd (``pyproject.toml``, ``healthd/``, ``probes/``)."""
    mirror: str = DEFAULT_MIRROR
    torch: str = DEFAULT_TORCH
    suite: str = SUITE


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def project_requirements(pyproject: Path) -> tuple[str, ...]:
    """healthd's declared dependencies and its ``probes`` extra, without torch (pinned apart)."""
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    reqs = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("probes", [])]
    return tuple(sorted(r for r in reqs if not re.match(r"^torch\b", r)))


def check_torch_spec(spec: str) -> None:
    """A torch spec must pin one version (``torch==X``): an unpinned torch may resolve to the CUDA
    build of several GB."""
    if not re.fullmatch(r"torch==[0-9][0-9A-Za-z.+]*", spec):
        raise ImageError(f"torch spec {spec!r}: pin one version, e.g. {DEFAULT_TORCH}")


def base_key(inputs: BuildInputs) -> str:
    """The base layer's cache key (pure once the requirements are read)."""
    recipe = {
        "version": RECIPE_VERSION,
        "suite": inputs.suite,
        "mirror": inputs.mirror,
        "packages": BASE_PACKAGES,
        "torch": inputs.torch,
        "requirements": project_requirements(inputs.source / "pyproject.toml"),
        "layout": [ENROOT_RC, IMAGE_ENV, SQUASH_OPTIONS, HEALTHD_SITE],
    }
    return _sha256_text(json.dumps(recipe, sort_keys=True))[:16]


def _wheel_files(source: Path) -> Iterator[Path]:
    yield source / "pyproject.toml"
    yield source / "healthd.example.toml"
    for top in ("healthd", "probes", "systemd", "grafana"):
        for path in sorted((source / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path


def healthd_key(source: Path) -> str:
    """The healthd layer's key: a hash of every file that goes into the wheel, and this recipe."""
    digest = hashlib.sha256(f"{RECIPE_VERSION}\n{HEALTHD_SITE}\n".encode())
    for path in _wheel_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def environment_file() -> str:
    """``/etc/environment`` (enroot reads it into the container's environment)."""
    return "".join(f"{key}={value}\n" for key, value in IMAGE_ENV)


def oci_runtime_config(
    args: Sequence[str],
    *,
    root: str = "rootfs",
    env: Iterable[tuple[str, str]] = (),
    mounts: Iterable[tuple[str, str, bool]] = (),
    cwd: str = "/",
) -> dict[str, Any]:
    """An OCI runtime ``config.json`` (runtime-spec 1.0) that runs ``args`` in ``root`` (pure).

    The root is read-only; the process keeps the caller's user (root in CI, a job's user under
    Slurm, which rewrites ``process`` and adds its own mounts). The network and UTS namespaces are
    the host's: multi-node NCCL needs the host network, and the probe names its node by the host
    name. ``mounts`` are ``(source, destination, read_only)`` binds.
    """
    environment = dict(IMAGE_ENV)
    environment.update(env)
    binds = [
        {
            "destination": dst,
            "type": "bind",
            "source": src,
            "options": ["rbind", "ro" if ro else "rw", "nosuid", "nodev"],
        }
        for src, dst, ro in mounts
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(args),
            "env": [f"{k}={v}" for k, v in environment.items()],
            "cwd": cwd,
            "noNewPrivileges": True,
            "capabilities": {
                kind: ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
                for kind in ("bounding", "effective", "permitted", "ambient")
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        },
        "root": {"path": root, "readonly": True},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=1g"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "bind", "source": "/sys",
             "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777"]},
            *binds,
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "mount")],
            "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware"],
            "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"],
        },
    }


# --- image check (pure on a file list) ---------------------------------------------------------

_SITE = re.compile(r"^(?:.*/)?(?:site|dist)-packages/([A-Za-z_][A-Za-z0-9_]*)/__init__\.py$")
_PYTHON = re.compile(r"^(?:usr/(?:local/)?bin|opt/[^/]+/bin|bin)/python3\.(\d+)$")


def image_problems(paths: Iterable[str], *, probes_mounted: bool = False) -> list[str]:
    """What an image whose files are ``paths`` (relative, no leading ``/``) lacks for
    ``python3 -m probes`` (pure; empty when it has everything). ``probes_mounted``: the launcher
    mounts the daemon's ``probes`` package, so the image need not have it."""
    pythons: set[int] = set()
    modules: set[str] = set()
    has_python3 = False
    for raw in paths:
        path = raw.removeprefix("./").lstrip("/")
        if path in ("usr/bin/python3", "usr/local/bin/python3", "bin/python3") or path.endswith("/bin/python3"):
            has_python3 = True
        if m := _PYTHON.match(path):
            pythons.add(int(m.group(1)))
        if m := _SITE.match(path):
            modules.add(m.group(1))
    problems: list[str] = []
    if not has_python3:
        problems.append("no python3 (looked in /usr/bin, /usr/local/bin, /bin and /opt/*/bin)")
    if pythons and max(pythons) < MIN_PYTHON[1]:
        problems.append(f"python3.{max(pythons)} is older than the 3.{MIN_PYTHON[1]} healthd's probes need")
    for module in REQUIRED_MODULES:
        if module == "probes" and probes_mounted:
            continue
        if module not in modules:
            problems.append(f"module {module!r} is not installed (no {module}/__init__.py in a site- or "
                            "dist-packages directory)")
    return problems


def image_files(image: Path, *, timeout: float = 300.0) -> list[str]:
    """The files of ``image``: a root directory (or an OCI bundle holding ``rootfs/``), a SquashFS
    file (``unsquashfs -l``) or an OCI image archive (the union of its layers)."""
    if image.is_dir():
        root = image / "rootfs" if (image / "config.json").is_file() and (image / "rootfs").is_dir() else image
        return [str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir() or p.is_symlink()]
    if not image.is_file():
        raise ImageError(f"{image}: no such image (a directory, a .sqsh or an OCI archive)")
    with image.open("rb") as f:
        magic = f.read(4)
    if magic == b"hsqs":
        done = process.run(["unsquashfs", "-d", "", "-lc", str(image)], timeout=timeout)
        if done.returncode != 0:
            raise ImageError(f"unsquashfs -l {image}: {done.stderr.strip() or done.stdout.strip()}")
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if tarfile.is_tarfile(image):
        return list(_oci_archive_files(image))
    raise ImageError(f"{image}: neither a directory, a SquashFS file nor a tar archive")


def _oci_archive_files(archive: Path) -> Iterator[str]:
    with tarfile.open(archive) as outer:
        def blob(digest: str) -> bytes:
            member = outer.extractfile("blobs/" + digest.replace(":", "/"))
            if member is None:
                raise ImageError(f"{archive}: blob {digest} is missing")
            return member.read()
        try:
            index = json.loads(outer.extractfile("index.json").read())  # type: ignore[union-attr]
        except (KeyError, AttributeError, json.JSONDecodeError) as exc:
            raise ImageError(f"{archive}: not an OCI image archive (index.json: {exc})") from exc
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            member = outer.extractfile("blobs/" + layer["digest"].replace(":", "/"))
            if member is None:
                raise ImageError(f"{archive}: layer {layer['digest']} is missing")
            with tarfile.open(fileobj=member, mode="r:") as inner:  # uncompressed: seeks past the data
                for entry in inner:
                    if not entry.isdir():
                        yield entry.name


# --- the build ---------------------------------------------------------------------------------

Log = Callable[[str], None]


def _stderr_log(message: str) -> None:
    print(f"healthd image: {message}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], *, timeout: float, what: str, env: Mapping[str, str] | None = None,
         cwd: Path | None = None) -> process.Completed:
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        raise ImageError(f"{what}: {argv[0]} is not installed (as root: scripts/install-debian-deps.sh containers)")
    done = process.run(argv, timeout=timeout, env=env, cwd=cwd)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        raise ImageError(f"{what} failed (exit {done.returncode}): {tail}")
    return done


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[4].replace("\\040", " ") for line in lines if len(line.split()) > 4]
    return [p for p in points if p.startswith(prefix) or p + "/" == prefix]


def _remove_tree(path: Path) -> None:
    """``rm -r path``, refused while anything is mounted below it (a root being built has /proc,
    /sys and /dev mounted: removing through them would remove the host's)."""
    if not path.exists() and not path.is_symlink():
        return
    mounted = _mounts_under(path)
    if mounted:
        raise ImageError(f"{path} still has mounts ({', '.join(mounted[:3])}); unmount them, then remove it")
    shutil.rmtree(path)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _layer_tar(root: Path, out: Path) -> str:
    """A deterministic tar of ``root`` (no device nodes: the runtimes make /dev); its sha256."""
    _run(["tar", "--sort=name", "--numeric-owner", "--mtime=@0", "--exclude=./dev/*", "--exclude=./proc/*",
          "--exclude=./sys/*", "-C", str(root), "-cf", str(out), "."], timeout=_TAR_TIMEOUT_S, what="tar")
    return _sha256_file(out)


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q", *args]


def _build_base(inputs: BuildInputs, base: Path, log: Log) -> None:
    """``base/rootfs`` (Debian + python3 + the dependencies), ``base/layer.tar`` and its digest."""
    tmp = base.with_name(base.name + ".tmp")
    _remove_tree(tmp)
    tmp.mkdir(parents=True)
    rootfs = tmp / "rootfs"
    log(f"base layer: mmdebstrap {inputs.suite} ({','.join(BASE_PACKAGES)}) from {inputs.mirror}")
    _run(["mmdebstrap", "--variant=minbase", "--mode=root", f"--include={','.join(BASE_PACKAGES)}",
          "--aptopt=Acquire::Retries \"3\"", "--dpkgopt=path-exclude=/usr/share/doc/*",
          "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
          inputs.suite, str(rootfs), inputs.mirror], timeout=_MMDEBSTRAP_TIMEOUT_S, what="mmdebstrap")
    reqs = project_requirements(inputs.source / "pyproject.toml")
    log(f"base layer: pip {inputs.torch} and {len(reqs)} requirements of healthd[probes]")
    _run(_pip("install", "--no-warn-script-location", "--prefer-binary", "--target",
              str(rootfs / SITE_PACKAGES), inputs.torch, *reqs), timeout=_PIP_TIMEOUT_S, what="pip install")
    for junk in ("torch/include", "torch/share/cmake", "bin"):
        shutil.rmtree(rootfs / SITE_PACKAGES / junk, ignore_errors=True)
    (rootfs / PTH_FILE).write_text(f"/{HEALTHD_SITE}\n")
    (rootfs / "etc" / "rc").write_text(ENROOT_RC)
    (rootfs / "etc" / "environment").write_text(environment_file())
    log("base layer: layer tar and SquashFS")
    digest = _layer_tar(rootfs, tmp / "layer.tar")
    (tmp / "layer.digest").write_text(digest + "\n")
    _run(["mksquashfs", str(rootfs), str(tmp / "base.sqsh"), "-noappend", "-quiet", "-no-progress",
          *SQUASH_OPTIONS, "-wildcards", "-e", "dev/*", "proc/*", "sys/*"], timeout=_TAR_TIMEOUT_S, what="mksquashfs")
    _remove_tree(base)
    tmp.rename(base)


def _build_healthd_layer(inputs: BuildInputs, stage: Path, log: Log) -> None:
    """``stage`` holds the healthd layer: the wheel's packages in ``stage/healthd/site-packages``."""
    wheels = stage.parent / "wheel"
    shutil.rmtree(wheels, ignore_errors=True)
    log("healthd layer: the wheel of this checkout")
    # hatchling where it is installed (the dev environment); else pip fetches it (build isolation)
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") is not None else []
    _run(_pip("wheel", "--no-deps", *isolation, "-w", str(wheels), str(inputs.source)),
         timeout=_PIP_TIMEOUT_S, what="pip wheel")
    built = sorted(wheels.glob("healthd-*.whl"))
    if not built:
        raise ImageError(f"pip wheel wrote no healthd wheel into {wheels}")
    wheel = built[0]
    _run(_pip("install", "--no-deps", "--no-compile", "--no-warn-script-location", "--target",
              str(stage / HEALTHD_SITE), str(wheel)), timeout=_PIP_TIMEOUT_S, what="pip install (healthd)")
    shutil.rmtree(stage / HEALTHD_SITE / "bin", ignore_errors=True)
    shutil.rmtree(wheels, ignore_errors=True)
    for path in [stage, *stage.rglob("*")]:
        os.chown(path, 0, 0, follow_symlinks=False)
        if path.is_dir():
            path.chmod(0o755)
        elif not path.is_symlink():
            path.chmod(0o644)


def oci_image_config(diff_ids: Sequence[str], *, created: str = "1970-01-01T00:00:00Z") -> dict[str, Any]:
    """The OCI image config (pure): amd64/linux, the image environment, ``python3 -m probes`` as
    the default command."""
    return {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [f"{k}={v}" for k, v in IMAGE_ENV],
            "Cmd": ["python3", "-m", "probes", "--help"],
            "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": IMAGE_NAME},
        },
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [{"created": created, "created_by": "healthd image build"} for _ in diff_ids],
    }


def _json_bytes(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def write_oci_archive(out: Path, layers: Sequence[tuple[Path, str]], *, tag: str) -> str:
    """An OCI image-layout archive of uncompressed ``layers`` (``(tar, sha256 digest)``) named
    ``healthd-probe:<tag>``; returns the image digest (the manifest's sha256)."""
    config = _json_bytes(oci_image_config([d for _, d in layers]))
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = _json_bytes({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": d, "size": p.stat().st_size} for p, d in layers],
    })
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = _json_bytes({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": f"{IMAGE_NAME}:{tag}"},
        }],
    })
    tmp = out.with_name(out.name + ".tmp")

    def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, "oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}))
        add_bytes(tar, "index.json", index)
        add_bytes(tar, "blobs/sha256/" + manifest_digest.split(":", 1)[1], manifest)
        add_bytes(tar, "blobs/sha256/" + config_digest.split(":", 1)[1], config)
        for path, digest in layers:
            info = tar.gettarinfo(str(path), arcname="blobs/sha256/" + digest.split(":", 1)[1])
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    tmp.rename(out)
    return manifest_digest


def read_record(out: Path) -> BuildRecord | None:
    """The record of the image built in ``out``, or ``None`` where there is none (or a foreign one)."""
    try:
        data = json.loads((out / RECORD_FILE).read_text())
        return BuildRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def parse_mount(text: str) -> tuple[str, str, bool]:
    """``SRC[:DST[:ro|rw]]`` as ``(src, dst, read_only)``.

    :raises ImageError: not absolute paths, or other flags.
    """
    parts = text.split(":")
    src, dst = parts[0], parts[1] if len(parts) > 1 and parts[1] else parts[0]
    flags = parts[2] if len(parts) > 2 else "rw"
    if len(parts) > 3 or flags not in ("ro", "rw") or not src.startswith("/") or not dst.startswith("/"):
        raise ImageError(f"mount {text!r}: expected SRC[:DST[:ro|rw]] with absolute paths")
    return src, dst, flags == "ro"


def write_bundle_config(out: Path, mounts: Sequence[tuple[str, str, bool]] = ()) -> None:
    """``out/bundle/config.json``: ``python3 -m probes env`` in the bundle's root with ``mounts``
    bound (the results directory for Slurm's ``srun --container``: its config.json carries them)."""
    path = out / BUNDLE_DIR / "config.json"
    path.write_text(json.dumps(oci_runtime_config(["python3", "-m", "probes", "env"], mounts=mounts), indent=2) + "\n")


def recorded_digest(image: str) -> str | None:
    """The digest ``healthd image build`` recorded for ``image`` when it is one of its outputs
    (``DIR/bundle``, ``DIR/healthd-probe.sqsh``, ``DIR/healthd-probe.oci.tar``), else ``None``."""
    path = Path(image)
    if not path.is_absolute() or path.name not in (BUNDLE_DIR, SQSH_FILE, OCI_ARCHIVE_FILE):
        return None
    record = read_record(path.parent)
    return record.digest if record is not None else None


def build_image(out: Path, inputs: BuildInputs, *, cache: Path = DEFAULT_CACHE, log: Log = _stderr_log,
                mounts: Sequence[tuple[str, str, bool]] = ()) -> BuildRecord:
    """Build (or find already built) the probe image in ``out`` (see the module docstring); the
    bundle's config.json binds ``mounts`` (written again on every call, built or not).

    :raises ImageError: a tool is missing or failed (its own message), or the torch spec is unpinned.
    """
    started = time.monotonic()

    def step(message: str) -> None:
        log(f"[{time.monotonic() - started:6.1f} s] {message}")

    check_torch_spec(inputs.torch)
    if os.geteuid() != 0:
        raise ImageError("healthd image build needs root (mmdebstrap --mode=root, the root's file owners)")
    bkey, hkey = base_key(inputs), healthd_key(inputs.source)
    with _locked(out / ".build.lock"):
        record = read_record(out)
        if (record is not None and record.base_key == bkey and record.healthd_key == hkey
                and all((out / p).exists() for p in (BUNDLE_DIR + "/config.json", SQSH_FILE, OCI_ARCHIVE_FILE))):
            write_bundle_config(out, mounts)
            step(f"up to date: {out} ({record.digest})")
            return record
        base = cache / f"base-{bkey}"
        base_seconds = 0.0
        with _locked(cache / ".base.lock"):
            if not (base / "layer.digest").is_file():
                t0 = time.monotonic()
                _build_base(inputs, base, step)
                base_seconds = time.monotonic() - t0
                step(f"base layer built in {base_seconds:.1f} s: {base}")
                for old in cache.glob("base-*"):
                    if old != base and old.is_dir():
                        _remove_tree(old)
        work = out / ".work"
        shutil.rmtree(work, ignore_errors=True)
        stage = work / "stage"
        stage.mkdir(parents=True)
        _build_healthd_layer(inputs, stage, step)
        healthd_tar = work / "healthd-layer.tar"
        healthd_digest = _layer_tar(stage, healthd_tar)
        (out / RECORD_FILE).unlink(missing_ok=True)

        step("bundle: rootfs (hard links to the base layer) and config.json")
        bundle = out / BUNDLE_DIR
        _remove_tree(bundle)
        bundle.mkdir(parents=True)
        _run(["cp", "-al", str(base / "rootfs"), str(bundle / "rootfs")], timeout=_TAR_TIMEOUT_S, what="cp -al")
        _run(["cp", "-a", str(stage / HEALTHD_TOP), str(bundle / "rootfs" / HEALTHD_TOP)],
             timeout=_TAR_TIMEOUT_S, what="cp (healthd layer)")
        write_bundle_config(out, mounts)

        step("SquashFS (enroot format): the base's, the healthd layer appended")
        sqsh = out / SQSH_FILE
        tmp_sqsh = out / (SQSH_FILE + ".tmp")
        shutil.copyfile(base / "base.sqsh", tmp_sqsh)
        _run(["mksquashfs", str(stage / HEALTHD_TOP), str(tmp_sqsh), "-keep-as-directory", "-quiet", "-no-progress"],
             timeout=_TAR_TIMEOUT_S, what="mksquashfs (append)")
        tmp_sqsh.rename(sqsh)

        step("OCI image archive")
        base_digest = (base / "layer.digest").read_text().strip()
        digest = write_oci_archive(out / OCI_ARCHIVE_FILE, [(base / "layer.tar", base_digest),
                                                            (healthd_tar, healthd_digest)], tag=hkey)
        shutil.rmtree(work, ignore_errors=True)
        record = BuildRecord(
            base_key=bkey, healthd_key=hkey, digest=digest, torch=inputs.torch, suite=inputs.suite,
            base_seconds=round(base_seconds, 1), seconds=round(time.monotonic() - started, 1),
            sizes={"rootfs": _tree_size(bundle / "rootfs"), "sqsh": sqsh.stat().st_size,
                   "oci": (out / OCI_ARCHIVE_FILE).stat().st_size},
        )
        (out / RECORD_FILE).write_text(record.to_json())
        step(f"built in {record.seconds:.1f} s: {out} ({digest})")
        return record
