#!/usr/bin/env bash
# Build the Python release and check it as a user would meet it. Two distributions come from this repository:
# gpumond (the agent and the rules service, pyproject.toml) and gpumond-job (the job SDK and the SDK↔service
# contract, standard library only: gpumond-job/pyproject.toml), which gpumond depends on at the same version.
#   1. `python -m build` makes each one's sdist, then its wheel from that sdist, into DIST (default dist/);
#   2. `twine check --strict` passes on all four (what PyPI would refuse: metadata, README rendering);
#   3. each sdist builds the same wheel as the checkout does (same files, same bytes: its RECORD), and no file is in
#      both wheels;
#   4. a bare virtual environment installs the gpumond-job wheel with no index at all (so it genuinely needs no
#      other package) and imports gpumond.job and gpumond.wire from it, and not the daemons;
#   5. a fresh virtual environment installs the gpumond wheel (not the checkout; gpumond-job from DIST) and
#      `gpumond --version` is the version in gpumond/__init__.py;
#   6. `gpumond demo --duration N` runs from that environment (DEMO_S, default 30; DEMO_S=0 skips it): the agents
#      and the rules service start, the job pushes, and the summary shows no false alarm. The demo exits 1 when a
#      planted fault was not found in time, which is expected in 30 s (the last fault is planted at 40 s), so
#      exit 0 or 1 with that summary passes; anything else fails.
#
#   scripts/check-release.sh                 # dist/gpumond-VERSION.tar.gz, dist/gpumond_job-VERSION.tar.gz, wheels
#   DIST=/tmp/dist DEMO_S=0 scripts/check-release.sh
#
# Needs python3 with `build` and `twine` (pip install build twine) and an index for the build backend and the
# wheel's dependencies (PyPI, or PIP_INDEX_URL / PIP_FIND_LINKS).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "check-release: $*" >&2; exit 1; }
# What is checked is the built wheels: a caller's PYTHONPATH (a checkout, which holds gpumond.egg-info after a
# build) would lend the venvs a module, or make their pip think gpumond is already installed.
unset PYTHONPATH
dist="${DIST:-dist}"
demo_s="${DEMO_S:-30}"
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gpumond/__init__.py)"
[ -n "$version" ] || die "no __version__ in gpumond/__init__.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$dist"
record() { python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode(), end="")' "$1"; }
# Each distribution from its own directory; its files are named by its project name with "-" as "_".
for dist_dir in . gpumond-job; do
    name="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["name"].replace("-", "_"))' "$dist_dir/pyproject.toml")"
    rm -f "$dist/$name-$version.tar.gz" "$dist/$name-$version-py3-none-any.whl"
    python3 -m build --outdir "$dist" "$dist_dir" >"$work/build.log" 2>&1 \
        || { tail -n 40 "$work/build.log" >&2; die "python -m build $dist_dir failed"; }
    sdist="$dist/$name-$version.tar.gz" wheel="$dist/$name-$version-py3-none-any.whl"
    if [ ! -f "$sdist" ] || [ ! -f "$wheel" ]; then die "python -m build made no $sdist and $wheel"; fi
    echo "check-release: built $sdist and $wheel (the wheel from the sdist)"

    python3 -m twine check --strict "$sdist" "$wheel"

    python3 -m build --wheel --outdir "$work/tree" "$dist_dir" >"$work/build-tree.log" 2>&1 \
        || { tail -n 40 "$work/build-tree.log" >&2; die "python -m build --wheel from the checkout ($dist_dir) failed"; }
    if ! diff <(record "$wheel") <(record "$work/tree/$(basename "$wheel")") >"$work/record.diff"; then
        cat "$work/record.diff" >&2
        die "the wheel built from the sdist differs from the one built from the checkout (above: < sdist, > checkout); a file is missing from the sdist"
    fi
    echo "check-release: the $name sdist builds the same wheel as the checkout ($(record "$wheel" | wc -l) files)"
done
sdist="$dist/gpumond-$version.tar.gz" wheel="$dist/gpumond-$version-py3-none-any.whl"
job_wheel="$dist/gpumond_job-$version-py3-none-any.whl"
files() { record "$1" | cut -d, -f1 | grep -v '\.dist-info/'; }
both="$(comm -12 <(files "$wheel" | sort) <(files "$job_wheel" | sort))"
[ -z "$both" ] || die "files in both wheels (each must ship in one): $both"
grep -qx 'gpumond/__init__.py' <(files "$job_wheel") || die "gpumond-job does not ship gpumond/__init__.py"

# No index and no --no-deps: if gpumond-job declared a dependency, this install would fail.
python3 -m venv "$work/bare"
"$work/bare/bin/python" -m pip install --quiet --disable-pip-version-check --no-index "$job_wheel" \
    || die "a bare venv could not install $job_wheel with no index: does it declare a dependency?"
probe='import importlib.util, gpumond, gpumond.job, gpumond.wire.media
assert importlib.util.find_spec("gpumond.rules") is None, "the daemons are in the SDK wheel"
print(gpumond.__version__, gpumond.job.__file__)'
# -I: neither PYTHONPATH nor the user's site may lend it a module.
got="$(cd "$work" && "$work/bare/bin/python" -I -c "$probe")" || die "the bare venv cannot import gpumond.job"
case "$got" in "$version $work/bare/"*) ;; *) die "the bare venv imports gpumond.job as '$got', not version $version from the wheel" ;; esac
echo "check-release: a bare venv imports gpumond.job $version from the gpumond-job wheel, with no other package"

python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --find-links "$dist" "$wheel" \
    || die "a fresh venv could not install $wheel"
got="$(cd "$work" && "$work/venv/bin/gpumond" --version)"
[ "$got" = "gpumond $version" ] || die "gpumond --version says '$got', gpumond/__init__.py says $version"
where="$(cd "$work" && "$work/venv/bin/python" -c 'import gpumond; print(gpumond.__file__)')"
case "$where" in "$work/venv/"*) ;; *) die "the fresh venv imports gpumond from $where, not from the wheel" ;; esac
echo "check-release: a fresh venv runs $got from the wheel"

if [ "$demo_s" != 0 ]; then
    demo_rc=0
    (cd "$work" && "$work/venv/bin/gpumond" demo --duration "$demo_s") | tee "$work/demo.out" || demo_rc=$?
    [ "$demo_rc" -le 1 ] || die "gpumond demo exited $demo_rc"
    grep -q "agents up, rules service up" "$work/demo.out" || die "the demo's agents and rules service did not start"
    grep -Eq "^[0-9]+ faults planted: .* 0 false alarms" "$work/demo.out" || die "the demo raised false alarms, or gave no summary"
    echo "check-release: the demo ran from the wheel: $(grep -E '^[0-9]+ faults planted' "$work/demo.out")"
fi
echo "check-release: ok"
