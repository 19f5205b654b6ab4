#!/usr/bin/env bash
# Build the gpumond container image with buildah (no daemon), from a wheelhouse made here: the build itself
# fetches nothing (pip --no-index inside it).
#
#   scripts/build-image.sh                        # FROM python:3.11-slim-bookworm (needs a registry that has it)
#   scripts/build-image.sh --local-base           # FROM a Debian bookworm base made here with mmdebstrap
#   scripts/build-image.sh --local-base --oci-archive build/gpumond.oci.tar   # ... and save it for `skopeo copy`
#
# Options:
#   --base IMAGE          the base image (default docker.io/library/python:3.11-slim-bookworm)
#   --local-base          make the base with mmdebstrap (Debian bookworm, minbase + python3) and commit it as
#                         localhost/gpumond-base:bookworm; reused when it exists (--rebuild-base remakes it)
#   --tag NAME            the image name (default ghcr.io/gpumond/gpumond:VERSION, the chart's default)
#   --wheel FILE          install this gpumond wheel (default: build one from this checkout)
#   --arch LIST           the architectures to build, comma-separated (default: this machine's); with two
#                         (the release: amd64,arm64) the tag names a manifest list, and the other architecture's
#                         build runs under emulation (qemu-user-static); not with --local-base
#   --oci-archive FILE    also save the image as an OCI archive (load it with `skopeo copy oci-archive:FILE ...`)
#   --push REF            also push it (every architecture) to REF, e.g. ghcr.io/gpumond/gpumond:0.1.0; log in
#                         first (buildah login REGISTRY)
#   --digest-file FILE    with --push: write the pushed image's digest (what to pin) to FILE
#   --context DIR         where the build context (its wheelhouse/, remade each time) is made (default build/image)
#
# Storage and isolation are buildah's: STORAGE_DRIVER, CONTAINERS_STORAGE_CONF and BUILDAH_ISOLATION are honoured
# (this script defaults BUILDAH_ISOLATION to chroot, which needs no user namespaces or runtime). Needs: buildah,
# python3 with pip; mmdebstrap for --local-base (Debian: apt-get install buildah mmdebstrap).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-image: $*" >&2; exit 2; }

base="docker.io/library/python:3.11-slim-bookworm"
local_base=0 rebuild_base=0 tag="" wheel="" oci_archive="" arches="" context="build/image"
push_to="" digest_file=""
while (($#)); do
    case "$1" in
        --base) base="${2:?--base needs an image}"; shift 2 ;;
        --local-base) local_base=1; shift ;;
        --rebuild-base) local_base=1; rebuild_base=1; shift ;;
        --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
        --wheel) wheel="${2:?--wheel needs a file}"; shift 2 ;;
        --arch) arches="${2:?--arch needs a list, e.g. amd64,arm64}"; shift 2 ;;
        --oci-archive) oci_archive="${2:?--oci-archive needs a file}"; shift 2 ;;
        --push) push_to="${2:?--push needs an image reference}"; shift 2 ;;
        --digest-file) digest_file="${2:?--digest-file needs a file}"; shift 2 ;;
        --context) context="${2:?--context needs a directory}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
command -v buildah >/dev/null || die "buildah is not installed: apt-get install buildah"
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"

# The one version source is gpumond/__init__.py (pyproject.toml reads it too).
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gpumond/__init__.py)"
[ -n "$version" ] || die "no __version__ in gpumond/__init__.py"
tag="${tag:-ghcr.io/gpumond/gpumond:$version}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
# The commit's time, not the build's, so that a rebuild of one commit carries the same label.
created="$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo 1970-01-01T00:00:00Z)"

host_arch() { case "$(uname -m)" in x86_64) echo amd64 ;; aarch64|arm64) echo arm64 ;; *) uname -m ;; esac; }
arches="${arches:-$(host_arch)}"
if ((local_base)) && [ "$arches" != "$(host_arch)" ]; then
    die "--local-base makes a base for this machine's architecture ($(host_arch)) only; leave out --arch"
fi

# ---- the base (made while the wheelhouse downloads: both wait on the network) ----
make_base() {
    local t0=$SECONDS rootfs
    rootfs="$(mktemp -d)/rootfs.tar"
    # Documentation and translations are left out (copyright files kept): the image has no man or locale.
    # shellcheck disable=SC2016  # the hook's $1 (the root being made) is mmdebstrap's to expand
    mmdebstrap --quiet --variant=minbase --include=python3 \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$rootfs" http://deb.debian.org/debian \
        "deb http://deb.debian.org/debian-security bookworm-security main"
    ctr="$(buildah from scratch)"
    buildah add --quiet "$ctr" "$rootfs" / >/dev/null
    buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    buildah commit --quiet --rm "$ctr" "$base" >/dev/null
    rm -rf "$(dirname "$rootfs")"
    echo "build-image: made $base in $((SECONDS - t0)) s" >&2
}
base_pid=""
# Never leave the base's build running behind a failed wheelhouse step.
trap 'if [ -n "$base_pid" ]; then wait "$base_pid" 2>/dev/null || true; fi' EXIT
if ((local_base)); then
    base="localhost/gpumond-base:bookworm"
    if ((rebuild_base)) || ! buildah inspect --type image "$base" >/dev/null 2>&1; then
        command -v mmdebstrap >/dev/null || die "--local-base needs mmdebstrap: apt-get install mmdebstrap"
        echo "build-image: making $base with mmdebstrap (Debian bookworm, minbase + python3)" >&2
        make_base &
        base_pid=$!
    fi
fi

# ---- the wheelhouse: gpumond's wheel, every dependency (with the k8s extra) for each architecture, and pip ----
started=$SECONDS
rm -rf "$context/wheelhouse" && mkdir -p "$context/wheelhouse"
# gpumond depends on gpumond-job of the same version (the job SDK, built from gpumond-job/), which no index has:
# it is always built from this checkout, and found in the wheelhouse.
python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$context/wheelhouse" ./gpumond-job
if [ -z "$wheel" ]; then
    python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$context/wheelhouse" .
    wheel="$(ls "$context"/wheelhouse/gpumond-"$version"-*.whl)"
else
    [ -f "$wheel" ] || die "--wheel $wheel: no such file"
    case "$(basename "$wheel")" in gpumond-"$version"-*.whl) ;; *) die "--wheel $wheel is not gpumond $version" ;; esac
    cp "$wheel" "$context/wheelhouse/"
fi
wheel_abs="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
for arch in ${arches//,/ }; do
    case "$arch" in amd64) machine=x86_64 ;; arm64) machine=aarch64 ;; *) die "--arch $arch: amd64 or arm64" ;; esac
    # Binary wheels only (nothing is compiled in the build), for CPython 3.11 on glibc 2.17 and later.
    platforms=(--platform "manylinux2014_$machine")
    for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_$machine"); done
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.11 --implementation cp "${platforms[@]}" \
        --find-links "$context/wheelhouse" --dest "$context/wheelhouse" "gpumond[k8s] @ file://$wheel_abs" pip
done
echo "build-image: wheelhouse ($arches) in $((SECONDS - started)) s" >&2
if [ -n "$base_pid" ]; then wait "$base_pid" || die "making the base with mmdebstrap failed (above)"; fi

# ---- the image: one, or with several --arch a manifest list of one image per architecture ----
# (building another architecture's image runs its RUN step under emulation: qemu-user-static with binfmt_misc)
started=$SECONDS
build_args=(--build-arg BASE="$base" --build-arg VERSION="$version" --build-arg REVISION="$revision"
            --build-arg CREATED="$created")
if [[ "$arches" == *,* ]]; then
    build_platforms="linux/${arches//,/,linux/}"
    buildah manifest rm "$tag" >/dev/null 2>&1 || true
    buildah build --quiet --layers --file Containerfile --platform "$build_platforms" --manifest "$tag" \
        "${build_args[@]}" "$context" >/dev/null
    push=(buildah manifest push --quiet --all "$tag")
else
    buildah build --quiet --layers --file Containerfile --tag "$tag" "${build_args[@]}" "$context" >/dev/null
    push=(buildah push --quiet "$tag")
fi
echo "build-image: built $tag ($arches) from $base in $((SECONDS - started)) s" >&2
if [ -n "$oci_archive" ]; then
    mkdir -p "$(dirname "$oci_archive")" && rm -f "$oci_archive"
    "${push[@]}" "oci-archive:$oci_archive:$tag"
    echo "build-image: saved $oci_archive" >&2
fi
if [ -n "$push_to" ]; then
    "${push[@]}" ${digest_file:+--digestfile "$digest_file"} "docker://$push_to"
    echo "build-image: pushed $push_to${digest_file:+ (digest in $digest_file)}" >&2
fi
echo "build-image: done in $SECONDS s" >&2
echo "$tag"
