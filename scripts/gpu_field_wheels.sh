#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_field_check.py needs on a GPU machine that has no network: gpumond's runtime
# dependencies (pyproject.toml's [project] dependencies, with theirs) built for that machine's Python, into .whl/
# (git-ignored). The machine must already have torch and nvidia-smi; the gpumond tree itself travels as source.
#
#   scripts/gpu_field_wheels.sh                       # CPython 3.12, manylinux x86_64, into .whl/
#   scripts/gpu_field_wheels.sh --dest /tmp/w --python 3.11 --dry-run
#
# Options:
#   --dest DIR        where the wheels go (default .whl; emptied first)
#   --python X.Y      the GPU machine's Python (default 3.12: `python3 --version` there)
#   --skip NAMES      comma-separated distributions not to carry because the machine has a version that fits
#                     (default numpy: gpumond needs >=1.26 and the GPU image's torch is built against its own;
#                     carrying another would shadow it, and it is the one large wheel)
#   --latest          the newest release of each (default: the version installed here where there is one, which
#                     is what the tests ran on)
#   --dry-run         resolve and list what would be downloaded (pip's resolver, nothing saved)
#
# Then, on the machine, from the repository root (docs/gpu-field-check.md):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_field_check.py --out gpu_field_check.md
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "gpu_field_wheels: $*" >&2; exit 2; }

dest=".whl" python="3.12" skip="numpy" dry_run=0 pin=1
while (($#)); do
    case "$1" in
        --dest) dest="${2:?--dest needs a folder}"; shift 2 ;;
        --python) python="${2:?--python needs a version like 3.12}"; shift 2 ;;
        --skip) skip="${2?--skip needs names (or '')}"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --latest) pin=0; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ "$python" =~ ^3\.[0-9]+$ ]] || die "--python: give a version like 3.12 (got '$python')"

# One source for what gpumond needs: pyproject.toml (tomllib: Python 3.11+, as gpumond itself).
# gpumond-job is this repository's own (gpumond/job, gpumond/wire), run from the tree there like the rest.
mapfile -t reqs < <(python3 -c 'import tomllib; print("\n".join(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if not r.startswith("gpumond-job")))')
((${#reqs[@]})) || die "no dependencies found in pyproject.toml"

# pip matches each manylinux tag exactly: name every glibc a wheel of these dependencies is built for (the GPU
# image is Ubuntu 24.04, glibc 2.39, so all of these run there).
platforms=()
for tag in manylinux1 manylinux2010 manylinux2014 manylinux_2_5 manylinux_2_12 manylinux_2_17 manylinux_2_24 \
           manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_39; do
    platforms+=(--platform "${tag}_x86_64")
done
target=(--only-binary=:all: --python-version "$python" --implementation cp "${platforms[@]}")

# Pin what this machine's Python has installed (the versions the test suite ran on here), so the GPU machine runs
# what CI tested; a dependency not installed here resolves to its newest release.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
python3 - "$constraints" <<'PY'
import importlib.metadata as md, re, sys
with open(sys.argv[1], "w") as out:
    for dist in md.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and name.lower() not in ("gpumond", "gpumond-job", "gpumond_job") and re.fullmatch(r"[0-9][0-9A-Za-z.]*", version):
            out.write(f"{name}=={version}\n")
PY
((pin)) || : > "$constraints"

if ((dry_run)); then
    # The resolver's report names what it would fetch, without saving a wheel (pip >= 23.2: --dry-run --report).
    python3 -m pip install --dry-run --ignore-installed --quiet --report - --target /tmp/gpu-field-wheels-dry-run \
        -c "$constraints" "${target[@]}" "${reqs[@]}" | python3 -c '
import json, sys
skip = set(filter(None, sys.argv[1].lower().replace("_", "-").split(",")))
for item in json.load(sys.stdin)["install"]:
    name, version = item["metadata"]["name"].lower().replace("_", "-"), item["metadata"]["version"]
    wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
    print("skip" if name in skip else "take", f"{name}=={version}", wheel)' "$skip"
    exit 0
fi

rm -rf "$dest"
mkdir -p "$dest"
python3 -m pip download --quiet --dest "$dest" -c "$constraints" "${target[@]}" "${reqs[@]}"
IFS=',' read -ra skipped <<< "$skip"
for name in "${skipped[@]}"; do
    [[ -n "$name" ]] || continue
    wheel_name="${name//-/_}"
    rm -f "$dest"/"$wheel_name"-*.whl "$dest"/"$name"-*.whl
done
# One version of each distribution: two would stop the install on the machine.
dupes=$(ls "$dest" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[[ -z "$dupes" ]] || die "two versions of: $dupes (remove one from $dest)"
echo "gpu_field_wheels: $(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest:"
ls "$dest" | sed 's/^/  /'
