#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs what the tests talk to, then runs pytest.
# Integration tests use real Prometheus, promtool, Alertmanager, node_exporter and systemd-analyze on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
command -v prometheus-node-exporter >/dev/null || need_apt+=(prometheus-node-exporter)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
command -v victoria-metrics >/dev/null || need_apt+=(victoria-metrics)
command -v slurmctld >/dev/null || need_apt+=(slurmctld)  # remediation tests drain nodes in a real Slurm
command -v slurmd >/dev/null || need_apt+=(slurmd)
command -v scontrol >/dev/null || need_apt+=(slurm-client)
command -v munged >/dev/null || need_apt+=(munge)
command -v prlimit >/dev/null || need_apt+=(util-linux)  # the slow-loris test runs a daemon under prlimit --nofile=1024
command -v chattr >/dev/null || need_apt+=(e2fsprogs)  # the policy disk-fault tests make state_dir immutable (binds root)
# The container image test builds the image with buildah from a Debian base made with mmdebstrap, and reads its
# OCI archive with skopeo. The base is made once per machine and kept in ~/.cache/gpumond/test-buildah
# (GPUMOND_TEST_BUILDAH_STORAGE moves it; GPUMOND_TEST_BUILDAH_STORAGE=tmp makes a throwaway one each run).
command -v buildah >/dev/null || need_apt+=(buildah)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
command -v skopeo >/dev/null || need_apt+=(skopeo)
if ((${#need_apt[@]})); then
    echo "installing Debian packages: ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian starts the packaged daemons on install; the tests run their own on free loopback ports.
# Both distributions, editable: gpumond-job (the job SDK, gpumond/job and gpumond/wire) is a dependency of gpumond
# that no index has; both map the one gpumond/ of this checkout.
python3 -m pip install -q --disable-pip-version-check -e ./gpumond-job -e '.[test]'
exec python3 -m pytest -q "$@"
