"""The probe image's pure parts and the OCI archive writer (healthd/image.py): what an image lacks
for ``python -m probes``, the bundle's config.json (golden), the archive's layout and digest, the
cache keys. The build itself runs in tests/integration/test_containers.py."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from healthd.cli import main
from healthd.cluster.slurm import launcher_from_settings
from healthd.config import LauncherSettings
from healthd.errors import ImageError
from healthd.image import (
    DEFAULT_TORCH,
    IMAGE_NAME,
    SITE_PACKAGES,
    BuildInputs,
    BuildRecord,
    base_key,
    check_torch_spec,
    environment_file,
    healthd_key,
    image_files,
    image_problems,
    oci_runtime_config,
    parse_mount,
    project_requirements,
    recorded_digest,
    write_oci_archive,
)
from healthd.jobs import LaunchSettings, render_batch_script
from healthd.model import ProbeJob
from tests.golden_files import assert_golden

REPO = Path(__file__).resolve().parents[2]
GOOD = [
    "usr/bin/python3", "usr/bin/python3.11",
    *[f"{SITE_PACKAGES}/{m}/__init__.py" for m in ("probes", "torch", "pydantic", "numpy")],
]


def test_an_image_with_everything_has_no_problems() -> None:
    assert image_problems(GOOD) == []
    assert image_problems(["./" + p for p in GOOD]) == []  # tar and unsquashfs listings


def test_a_site_image_with_conda_and_the_probes_mounted() -> None:
    conda = ["opt/conda/bin/python3", "opt/conda/bin/python3.12",
             *[f"opt/conda/lib/python3.12/site-packages/{m}/__init__.py" for m in ("torch", "pydantic", "numpy")]]
    assert image_problems(conda, probes_mounted=True) == []
    assert image_problems(conda) == ["module 'probes' is not installed (no probes/__init__.py in a site- or "
                                     "dist-packages directory)"]


@pytest.mark.parametrize(("drop", "problem"), [
    ("usr/bin/python3", "no python3"),
    (f"{SITE_PACKAGES}/torch/__init__.py", "module 'torch' is not installed"),
    (f"{SITE_PACKAGES}/pydantic/__init__.py", "module 'pydantic' is not installed"),
])
def test_what_an_image_lacks(drop: str, problem: str) -> None:
    problems = image_problems([p for p in GOOD if p != drop])
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_an_old_python_is_named() -> None:
    old = ["usr/bin/python3", "usr/bin/python3.8",
           *[f"usr/lib/python3/dist-packages/{m}/__init__.py" for m in ("probes", "torch", "pydantic", "numpy")]]
    assert image_problems(old) == ["python3.8 is older than the 3.11 healthd's probes need"]


def test_bundle_config() -> None:
    config = oci_runtime_config(["python3", "-m", "probes", "env"], root="/images/healthd-probe/bundle/rootfs",
                                env=[("HEALTHD_CONTAINER_IMAGE", "sha256:ab")],
                                mounts=[("/shared/healthd/results", "/shared/healthd/results", False),
                                        ("/etc/nccl.conf", "/etc/nccl.conf", True)])
    assert_golden("oci_bundle_config.json", json.dumps(config, indent=2) + "\n")
    assert config["root"] == {"path": "/images/healthd-probe/bundle/rootfs", "readonly": True}
    assert "network" not in {n["type"] for n in config["linux"]["namespaces"]}  # the host's: NCCL across nodes
    assert "HEALTHD_CONTAINER_IMAGE=sha256:ab" in config["process"]["env"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["process"]["env"]


def test_environment_file_is_enroots_format() -> None:
    lines = environment_file().splitlines()
    assert lines[0].startswith("PATH=/usr/local/sbin:") and all("=" in line and " " not in line for line in lines)


@pytest.mark.parametrize("spec", ["torch", "torch>=2.1", "torch==2.*", "numpy==1.0"])
def test_an_unpinned_torch_is_refused(spec: str) -> None:
    with pytest.raises(ImageError, match="pin one version"):
        check_torch_spec(spec)


def test_the_default_torch_is_pinned() -> None:
    check_torch_spec(DEFAULT_TORCH)
    check_torch_spec("torch==2.13.0+cpu")


def test_requirements_are_healthds_without_torch() -> None:
    reqs = project_requirements(REPO / "pyproject.toml")
    assert any(r.startswith("pydantic>=") for r in reqs) and any(r.startswith("numpy") for r in reqs)
    assert not any(r.startswith("torch") for r in reqs)


def copy_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for name in ("pyproject.toml", "healthd.example.toml"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    for top in ("healthd", "probes", "systemd", "grafana"):
        shutil.copytree(REPO / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_keys_follow_their_inputs(tmp_path: Path) -> None:
    """A code change moves only the healthd layer's key; the torch pin moves only the base's."""
    src = copy_source(tmp_path)
    inputs = BuildInputs(source=src)
    base, code = base_key(inputs), healthd_key(src)
    (src / "probes" / "gemm.py").write_text((src / "probes" / "gemm.py").read_text() + "\n# changed\n")
    assert base_key(inputs) == base
    assert healthd_key(src) != code
    assert base_key(BuildInputs(source=src, torch="torch==2.12.0")) != base


def layer(tmp_path: Path, name: str, files: dict[str, bytes]) -> tuple[Path, str]:
    path = tmp_path / f"{name}.tar"
    with tarfile.open(path, "w") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_oci_archive_layout_and_digest(tmp_path: Path) -> None:
    """The OCI image layout in a tar: index.json names the image, the manifest's sha256 is the
    digest returned, every blob is stored under its own digest, and image_files sees both layers."""
    layers = [layer(tmp_path, "base", {"usr/bin/python3": b"#!", **{
        f"{SITE_PACKAGES}/{m}/__init__.py": b"" for m in ("torch", "pydantic", "numpy")}}),
              layer(tmp_path, "healthd", {f"{SITE_PACKAGES}/probes/__init__.py": b"", "etc/rc": b"exec \"$@\"\n"})]
    archive = tmp_path / "image.oci.tar"
    digest = write_oci_archive(archive, layers, tag="abc")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        blobs = {n: tar.extractfile(n).read() for n in names if n.startswith("blobs/")}  # type: ignore[union-attr]
    assert {"oci-layout", "index.json"} <= names
    for name, data in blobs.items():
        assert name == "blobs/sha256/" + hashlib.sha256(data).hexdigest()
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == f"{IMAGE_NAME}:abc"
    manifest = json.loads(blobs["blobs/sha256/" + digest.split(":")[1]])
    assert [x["digest"] for x in manifest["layers"]] == [d for _, d in layers]
    config = json.loads(blobs["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["rootfs"]["diff_ids"] == [d for _, d in layers]
    assert image_problems(image_files(archive)) == []
    assert write_oci_archive(tmp_path / "again.tar", layers, tag="abc") == digest  # deterministic


def test_check_of_a_missing_image(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="no such image"):
        image_files(tmp_path / "nope.sqsh")


@pytest.mark.parametrize(("text", "parsed"), [
    ("/shared/results", ("/shared/results", "/shared/results", False)),
    ("/a:/b:ro", ("/a", "/b", True)),
    ("/a::rw", ("/a", "/a", False)),
])
def test_bundle_mounts(text: str, parsed: tuple[str, str, bool]) -> None:
    assert parse_mount(text) == parsed


@pytest.mark.parametrize("text", ["rel", "/a:b", "/a:/b:z", "/a:/b:ro:x"])
def test_bad_bundle_mounts(text: str) -> None:
    with pytest.raises(ImageError, match="expected SRC"):
        parse_mount(text)


def fake_root(root: Path, files: list[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


def test_cli_check_of_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = fake_root(tmp_path / "good", GOOD)
    assert main(["image", "check", str(good)]) == 0
    assert "has python3 >= 3.11 and probes, torch, pydantic, numpy" in capsys.readouterr().out
    bad = fake_root(tmp_path / "bad", [p for p in GOOD if "/torch/" not in p and "/probes/" not in p])
    assert main(["image", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "module 'torch' is not installed" in err and "module 'probes' is not installed" in err
    assert main(["image", "check", "--probes-mounted", str(bad)]) == 1
    assert "probes" not in capsys.readouterr().err


def test_cli_build_refuses_an_unpinned_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image", "build", "--out", str(tmp_path / "out"), "--torch", "torch>=2"]) == 1
    assert "pin one version" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_recorded_digest_names_the_image_in_the_script(tmp_path: Path) -> None:
    """An image that ``healthd image build`` wrote is exported as IMAGE@DIGEST (the daemon reads the
    record beside it when it starts), so the probe's ``environment.container_image`` names it by digest."""
    record = BuildRecord(base_key="b", healthd_key="h", digest="sha256:" + "ab" * 32, torch=DEFAULT_TORCH,
                         suite="bookworm", base_seconds=0.0, seconds=1.0, sizes={})
    (tmp_path / "healthd-probe.json").write_text(record.to_json())
    bundle = str(tmp_path / "bundle")
    assert recorded_digest(bundle) == record.digest
    assert recorded_digest(str(tmp_path / "healthd-probe.sqsh")) == record.digest
    assert recorded_digest(str(tmp_path / "other.sqsh")) is None
    assert recorded_digest("localhost/healthd-probe:h") is None
    settings = LauncherSettings(kind="oci", image=bundle, probes_from="image")
    launcher = launcher_from_settings(settings, REPO / "probes")
    job = ProbeJob(run_id="feedfacecafe0003", probe="gemm", nodes=("gpu01",), timeout_s=60.0)
    script = render_batch_script(job, LaunchSettings(python="python3", results_dir=Path("/r"), launcher=launcher),
                                 ranks_per_node=1, gpus_per_node=0)
    assert f"export HEALTHD_CONTAINER_IMAGE={bundle}@{record.digest}" in script.splitlines()


def test_the_container_tests_run_last(pytestconfig: pytest.Config) -> None:
    """scripts/test.sh builds the probe image beside the suite and does not wait for it: only the
    tests marked ``containers`` do, so tests/conftest.py moves them behind every other test, each
    group in its own order."""
    from tests.conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, nodeid: str, *markers: str) -> None:
            self.nodeid, self.markers = nodeid, markers
            self.path = REPO / nodeid.split("::")[0]

        def get_closest_marker(self, name: str) -> object | None:
            return name if name in self.markers else None

    items = [Item("tests/unit/test_a.py::t1"), Item("tests/integration/test_containers.py::c1", "slow", "containers"),
             Item("tests/integration/test_b.py::t2", "slurm"),
             Item("tests/integration/test_containers.py::c2", "containers"), Item("tests/unit/test_c.py::t3")]
    pytest_collection_modifyitems(pytestconfig, items)  # type: ignore[arg-type]
    assert [i.nodeid.split("::")[1] for i in items] == ["t1", "t2", "t3", "c1", "c2"]
