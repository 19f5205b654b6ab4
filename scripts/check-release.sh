#!/usr/bin/env bash
# Build the Python release (wheel and sdist) and check it as a user would meet it:
#   1. `python -m build` makes the sdist, then the wheel from the sdist, into DIST (default dist/);
#   2. `twine check --strict` passes on both (what PyPI would refuse: metadata, README rendering);
#   3. the sdist builds the same wheel as the checkout does (same files, same bytes: its RECORD);
#   4. a fresh virtual environment installs the wheel (not the checkout) and `gpumond --version` is the version in
#      gpumond/__init__.py;
#   5. `gpumond demo --duration N` runs from that environment (DEMO_S, default 30; DEMO_S=0 skips it): the agents
#      and the rules service start, the job pushes, and the summary shows no false alarm. The demo exits 1 when a
#      planted fault was not found in time, which is expected in 30 s (the last fault is planted at 40 s), so
#      exit 0 or 1 with that summary passes; anything else fails.
#
#   scripts/check-release.sh                 # dist/gpumond-VERSION.tar.gz and dist/gpumond-VERSION-py3-none-any.whl
#   DIST=/tmp/dist DEMO_S=0 scripts/check-release.sh
#
# Needs python3 with `build` and `twine` (pip install build twine) and an index for the build backend and the
# wheel's dependencies (PyPI, or PIP_INDEX_URL / PIP_FIND_LINKS).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "check-release: $*" >&2; exit 1; }
dist="${DIST:-dist}"
demo_s="${DEMO_S:-30}"
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gpumond/__init__.py)"
[ -n "$version" ] || die "no __version__ in gpumond/__init__.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$dist"
rm -f "$dist/gpumond-$version.tar.gz" "$dist/gpumond-$version-py3-none-any.whl"
python3 -m build --outdir "$dist" . >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; die "python -m build failed"; }
sdist="$dist/gpumond-$version.tar.gz" wheel="$dist/gpumond-$version-py3-none-any.whl"
if [ ! -f "$sdist" ] || [ ! -f "$wheel" ]; then die "python -m build made no $sdist and $wheel"; fi
echo "check-release: built $sdist and $wheel (the wheel from the sdist)"

python3 -m twine check --strict "$sdist" "$wheel"

python3 -m build --wheel --outdir "$work/tree" . >"$work/build-tree.log" 2>&1 \
    || { tail -n 40 "$work/build-tree.log" >&2; die "python -m build --wheel from the checkout failed"; }
record() { python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode(), end="")' "$1"; }
if ! diff <(record "$wheel") <(record "$work/tree/$(basename "$wheel")") >"$work/record.diff"; then
    cat "$work/record.diff" >&2
    die "the wheel built from the sdist differs from the one built from the checkout (above: < sdist, > checkout); a file is missing from the sdist"
fi
echo "check-release: the sdist builds the same wheel as the checkout ($(record "$wheel" | wc -l) files)"

python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" \
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
