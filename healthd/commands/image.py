"""``healthd image build --out DIR`` and ``healthd image check IMAGE`` (docs/containers.md).

``build`` writes the probe image three ways (an OCI bundle for crun and ``srun --container``, an
enroot-format ``.sqsh``, an OCI archive for podman and Apptainer) from this checkout, offline but for
the Debian mirror and pip's registries (:mod:`healthd.image`); ``check`` says whether an image (a
site's own, or ours) has what ``python -m probes`` needs: exit 0 when it has, 1 with each thing
missing on stderr."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from healthd import image
from healthd.commands.common import EXIT_OK, EXIT_TROUBLE


def _source_default() -> Path:
    return Path(image.__file__).resolve().parent.parent


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("image", help="build the probe container image, or check one")
    verbs = p.add_subparsers(dest="image_command", required=True, metavar="VERB")
    b = verbs.add_parser("build", help="build the probe image (bundle, .sqsh, OCI archive) into a directory")
    b.add_argument("--out", type=Path, required=True, help="directory for bundle/, healthd-probe.sqsh, "
                   "healthd-probe.oci.tar and healthd-probe.json")
    b.add_argument("--cache", type=Path, default=Path(os.environ.get("HEALTHD_IMAGE_CACHE", image.DEFAULT_CACHE)),
                   help="where the base layer (Debian, torch) is kept "
                   f"(default $HEALTHD_IMAGE_CACHE or {image.DEFAULT_CACHE})")
    b.add_argument("--mirror", default=os.environ.get("HEALTHD_IMAGE_MIRROR", image.DEFAULT_MIRROR),
                   help="Debian mirror for mmdebstrap (default $HEALTHD_IMAGE_MIRROR or deb.debian.org)")
    b.add_argument("--mount", action="append", default=[], metavar="SRC[:DST[:ro|rw]]",
                   help="a bind mount for the bundle's config.json (repeat): the results directory for "
                   "Slurm's srun --container (launcher kind oci)")
    b.add_argument("--torch", default=image.DEFAULT_TORCH, help=f"pinned torch spec (default {image.DEFAULT_TORCH})")
    b.add_argument("--source", type=Path, default=_source_default(),
                   help="the healthd checkout to build the wheel from")
    b.set_defaults(func=cmd_build)
    c = verbs.add_parser("check", help="say whether an image has what `python -m probes` needs")
    c.add_argument("image", type=Path, metavar="IMAGE", help="a root directory or bundle, a .sqsh, or an OCI archive")
    c.add_argument("--probes-mounted", action="store_true",
                   help="the launcher mounts the probes package (launcher.probes_dir): the image need not have it")
    c.set_defaults(func=cmd_check)


def cmd_build(args: argparse.Namespace) -> int:
    source = args.source.resolve()
    if not (source / "pyproject.toml").is_file():
        print(f"healthd image build: {source} is not a healthd checkout (no pyproject.toml); give --source",
              file=sys.stderr)
        return EXIT_TROUBLE
    mounts = [image.parse_mount(m) for m in args.mount]
    record = image.build_image(args.out.resolve(), image.BuildInputs(source=source, mirror=args.mirror,
                                                                     torch=args.torch), cache=args.cache,
                               mounts=mounts)
    print(record.to_json(), end="")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    problems = image.image_problems(image.image_files(args.image), probes_mounted=args.probes_mounted)
    for problem in problems:
        print(f"{args.image}: {problem}", file=sys.stderr)
    if problems:
        return EXIT_TROUBLE
    print(f"{args.image}: has python3 >= 3.{image.MIN_PYTHON[1]} and {', '.join(image.REQUIRED_MODULES)}")
    return EXIT_OK
