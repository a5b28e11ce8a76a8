# syntax=docker/dockerfile:1
#
# healthd in a container, for CI, development and demos. Without a config it runs on the built-in
# defaults: no Slurm answers, so it probes this container's CPU with the local backend. In
# production run it on the admin node under systemd instead (systemd/healthd.service).
#
#   docker build -t healthd .
#   docker run --init -p 9469:9469 -v healthd-state:/var/lib/healthd healthd
#   docker run --rm -v "$PWD/healthd.toml:/etc/healthd/healthd.toml:ro" healthd check-config
#
# --init: probes run in their own process groups and are killed as groups on timeout; as PID 1,
# healthd would never reap the orphans that leaves. Stop with a grace period above the daemon's
# 10 s (docker stop -t 30, compose stop_grace_period: 30s); docker's default is exactly 10 s.
#
# Talking to a real Slurm cluster needs the site's Slurm, not anything baked in here:
#  - the site's sinfo/squeue/sbatch/scontrol/scancel and the libslurm/libmunge they link,
#    mounted or from an image built FROM this one (point slurm.bin_dir at them); Debian's
#    slurm-client only talks to controllers within Slurm's version-skew window;
#  - the cluster config and munge's socket: -v /etc/slurm:/etc/slurm:ro -v /run/munge:/run/munge
#  - the UID that slurmctld knows as the healthd account (munge vouches for the caller's UID):
#    --user <uid>:<gid> of that account instead of the image's 10001, with a state volume that
#    this UID owns;
#  - slurm.results_dir on the filesystem shared with the compute nodes, at the same path.

FROM python:3.11-slim-bookworm AS build
RUN python -m venv /opt/healthd
ENV PATH=/opt/healthd/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# torch (the `probes` extra: the local backend runs the probes in this container) from PyTorch's
# CPU-only index: a 192 MB wheel (754 MB installed).
# The default PyPI build for Linux brings the CUDA libraries (nvidia-*/cuda-* wheels) and triton:
# about 3 GB of wheels in all for torch 2.14.1, none of which a container probing its own CPU
# loads. GPU probes run on the compute nodes, in the site's own Python environment.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md healthd.example.toml ./
COPY healthd ./healthd
COPY probes ./probes
COPY grafana ./grafana
COPY systemd ./systemd
# Build the wheel, then install it with the probes extra (its other dependencies from PyPI; torch is
# already satisfied). `set --` puts the wheel's versioned file name in $1.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && set -- /wheels/healthd-*.whl \
 && pip install --no-cache-dir "healthd[probes] @ file://$1"

FROM python:3.11-slim-bookworm
# STATE_DIRECTORY is what systemd's StateDirectory= would set: healthd keeps its SQLite store
# and probe results there. The example config with every key is in the package, at
# /opt/healthd/lib/python3.11/site-packages/healthd/_data/healthd.example.toml.
ENV PATH=/opt/healthd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONFAULTHANDLER=1 \
    HOME=/var/lib/healthd \
    STATE_DIRECTORY=/var/lib/healthd
RUN groupadd --system --gid 10001 healthd \
 && useradd --system --uid 10001 --gid healthd --home-dir /var/lib/healthd --no-create-home \
      --shell /usr/sbin/nologin healthd \
 && install -d -o root -g healthd -m 0750 /etc/healthd \
 && install -d -o healthd -g healthd -m 0750 /var/lib/healthd
COPY --from=build /opt/healthd /opt/healthd
USER 10001:10001
WORKDIR /var/lib/healthd
VOLUME ["/etc/healthd", "/var/lib/healthd"]
EXPOSE 9469
# /healthz answers 503 when the scheduler has not ticked for scheduler.heartbeat_stale_s.
# The port follows HEALTHD_HTTP__PORT; a port set only in the config file needs the same here.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/opt/healthd/bin/python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:%s/healthz' % os.environ.get('HEALTHD_HTTP__PORT', '9469'), timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["healthd"]
CMD ["run"]
