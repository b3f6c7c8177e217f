#!/usr/bin/env bash
# tools/install-peer.sh: the pinned peer environment (issue 18): a Python venv with PyPI's torch and
# diffusers at pinned versions, h5py, numpy, safetensors and this checkout's flux_dump package
# (python/), in which tests/peer_diffusers.sh runs diffusers' real FLUX.1 / FLUX.2 transformers,
# dumps them with the hook and judges them with flux-oracle. Nothing else uses it: without it that
# test is SKIPPED.
#
#   tools/install-peer.sh [--venv DIR] [--cache DIR] [--python PY] [--full] [--force] [--check]
#
#   --venv DIR    where the venv goes (default: .venv-peer/ in the repository, git-ignored;
#                 env FLUX_PEER_VENV)
#   --cache DIR   the wheelhouse: every wheel downloaded is kept there, and a later run (a fresh
#                 venv, another checkout, CI on the same machine) installs from it with no network
#                 (default: ~/.cache/flux-sim-peer; env FLUX_PEER_CACHE)
#   --python PY   the interpreter the venv is made from (default /usr/bin/python3, else python3;
#                 env FLUX_PEER_PYTHON). Python 3.10-3.13 (torch 2.15's wheels).
#   --full        torch with every dependency pip resolves for it. The default leaves out the two
#                 that only GPU code uses (triton: torch.compile's GPU kernels; cuda-bindings:
#                 the CUDA driver's Python API), 0.29 GB of 2.9 GB
#   --force       rebuild the venv even when it is up to date
#   --check       only say whether the venv is there and up to date (exit 0) or not (exit 1)
#
# Which torch wheel: the CPU-only build from PyTorch's own CPU index is tried first (one request,
# 10 s); where that index cannot be reached, PyPI's torch (the CUDA build: it runs on a CPU, but
# the CUDA libraries it links must be installed, ~2.6 GB from PyPI's nvidia-* wheels). The run
# prints which one it used and records it in DIR/peer-stamp.
#
# Beside the venv, in DIR/diffusers-0.37.1/ (never in the repository), it places diffusers 0.37.1
# (the customer's version of seed 001, a pure-Python wheel of 5 MB, `pip install --no-deps
# --target`, from the same wheelhouse): tests/peer_cp.sh runs it with that folder first on
# PYTHONPATH, the venv's torch and diffusers' dependencies under it. Where it cannot be had (no
# wheel in the cache and no network) the script says so on one WARNING line and carries on: only
# that part of tests/peer_cp.sh is SKIPPED.
#
# Idempotent: a venv whose stamp names the same pins is kept (seconds; flux_dump is reinstalled
# when python/ changed); an interrupted or failed build leaves no stamp, so the next run rebuilds.
# An error ends it with exit 1 and ONE line on stderr naming the step and the log
# (CACHE/install-peer.log). Timings of a first and a second run: docs/peers.md.
set -uo pipefail

TORCH_VERSION=2.15.0
DIFFUSERS_VERSION=0.42.1
OLD_DIFFUSERS_VERSION=0.37.1   # seed 001's customer version, beside the venv (tests/peer_cp.sh)
PINS=("h5py==3.16.0" "numpy==2.4.6" "safetensors==0.8.0")   # the versions the references were made with
CPU_INDEX=https://download.pytorch.org/whl/cpu
GPU_ONLY_DEPS="triton cuda-bindings"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FLUX_PEER_VENV:-$ROOT/.venv-peer}
CACHE=${FLUX_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flux-sim-peer}
PYBIN=${FLUX_PEER_PYTHON:-}
FULL=0; FORCE=0; CHECK=0

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --venv) VENV=${2:?--venv needs a folder}; shift ;;
    --cache) CACHE=${2:?--cache needs a folder}; shift ;;
    --python) PYBIN=${2:?--python needs an interpreter}; shift ;;
    --full) FULL=1 ;;
    --force) FORCE=1 ;;
    --check) CHECK=1 ;;
    *) echo "install-peer: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
case $VENV in /*) ;; *) VENV=$PWD/$VENV ;; esac
case $CACHE in /*) ;; *) CACHE=$PWD/$CACHE ;; esac
if [ -z "$PYBIN" ]; then
  if [ -x /usr/bin/python3 ]; then PYBIN=/usr/bin/python3; else PYBIN=python3; fi
fi

START=$(date +%s)
WH=$CACHE/wheels          # PyPI's wheels
WHCPU=$CACHE/wheels-cpu   # the CPU index's torch wheel, when it could be reached
LOG=$CACHE/install-peer.log
STAMP=$VENV/peer-stamp
die() { echo "install-peer: FAILED: $* (log: $LOG)" >&2; exit 1; }
say() { echo "install-peer: $*"; }
run() { echo "+ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }

pyver=$("$PYBIN" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
  { echo "install-peer: FAILED: no Python at '$PYBIN' (--python)" >&2; exit 1; }
case $pyver in 3.1[0-3]) ;; *) echo "install-peer: FAILED: $PYBIN is Python $pyver; torch $TORCH_VERSION has wheels for 3.10-3.13 (--python)" >&2; exit 1 ;; esac

# what the stamp says: the pins and the interpreter (the wheel source is recorded on line 2)
SPEC="torch==$TORCH_VERSION diffusers==$DIFFUSERS_VERSION ${PINS[*]} full=$FULL python=$pyver"
pkg_hash() { (cd "$ROOT/python" && find . -path ./build -prune -o -name '*.egg-info' -prune -o -name __pycache__ -prune \
               -o -type f -print | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16); }
PKG=$(pkg_hash)
VERIFY="import torch, diffusers, h5py, numpy, safetensors, flux_dump, torch.distributed as d
from diffusers import FluxTransformer2DModel, Flux2Transformer2DModel
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__
assert diffusers.__version__ == '$DIFFUSERS_VERSION', diffusers.__version__
assert d.is_gloo_available(), 'gloo'
print(torch.__version__, diffusers.__version__)"

up_to_date() {   # the stamp names these pins and the venv imports them
  [ -f "$STAMP" ] && [ "$(sed -n 1p "$STAMP")" = "$SPEC" ] &&
    "$VENV/bin/python" -c "$VERIFY" >/dev/null 2>&1
}
install_pkg() {   # this checkout's python/ (copied: a build in place leaves build/ and egg-info there)
  local t
  t=$(mktemp -d "${TMPDIR:-/tmp}/flux-peer-pkg.XXXXXX") || return 1
  cp -r "$ROOT/python" "$t/src" && rm -rf "$t/src/build" "$t/src"/*.egg-info &&
    run "$VENV/bin/pip" install --no-deps --no-build-isolation --no-index "$t/src"
  local rc=$?
  rm -rf "$t"
  return $rc
}

place_old() {   # diffusers $OLD_DIFFUSERS_VERSION in $VENV/diffusers-$OLD_DIFFUSERS_VERSION: optional, never fatal
  local dir=$VENV/diffusers-$OLD_DIFFUSERS_VERSION got
  local chk="import diffusers; assert diffusers.__version__ == '$OLD_DIFFUSERS_VERSION', diffusers.__version__
assert diffusers.__file__.startswith('$dir/'), diffusers.__file__
from diffusers import FluxTransformer2DModel, ContextParallelConfig"
  if [ -f "$dir/.placed" ] && PYTHONPATH=$dir "$VENV/bin/python" -c "$chk" >/dev/null 2>&1; then return 0; fi
  rm -rf "$dir" "$dir.tmp"
  if ! ls "$WH"/diffusers-"$OLD_DIFFUSERS_VERSION"-*.whl >/dev/null 2>&1; then
    run "$VENV/bin/pip" --disable-pip-version-check download --no-deps -d "$WH" "diffusers==$OLD_DIFFUSERS_VERSION" ||
      { say "WARNING: diffusers $OLD_DIFFUSERS_VERSION could not be downloaded into $WH (offline?): tests/peer_cp.sh's seed-001 part will be SKIPPED"; return 0; }
  fi
  if run "$VENV/bin/pip" --disable-pip-version-check install --no-deps --no-index --find-links "$WH" --target "$dir.tmp" \
       "diffusers==$OLD_DIFFUSERS_VERSION" && mv "$dir.tmp" "$dir" && PYTHONPATH=$dir "$VENV/bin/python" -c "$chk" >>"$LOG" 2>&1; then
    touch "$dir/.placed"
    say "diffusers $OLD_DIFFUSERS_VERSION placed in $dir ($(du -sm "$dir" | cut -f1) MB; PYTHONPATH=$dir for tests/peer_cp.sh)"
  else
    rm -rf "$dir" "$dir.tmp"
    say "WARNING: diffusers $OLD_DIFFUSERS_VERSION could not be installed into $dir (see $LOG): tests/peer_cp.sh's seed-001 part will be SKIPPED"
  fi
  return 0
}

if [ $CHECK -eq 1 ]; then
  if up_to_date && [ "$(sed -n 3p "$STAMP")" = "flux_dump=$PKG" ]; then
    say "up to date: $VENV ($(sed -n 2p "$STAMP"))"
    [ -f "$VENV/diffusers-$OLD_DIFFUSERS_VERSION/.placed" ] || say "(diffusers $OLD_DIFFUSERS_VERSION is not placed beside it: tests/peer_cp.sh's seed-001 part would be SKIPPED)"
    exit 0
  fi
  say "not installed or not up to date: $VENV"; exit 1
fi

mkdir -p "$CACHE" "$WH" 2>/dev/null || { echo "install-peer: FAILED: cannot make $CACHE (--cache)" >&2; exit 1; }
echo "==== $(date -u +%FT%TZ) install-peer $SPEC venv=$VENV" >>"$LOG"

if [ $FORCE -eq 0 ] && up_to_date; then
  if [ "$(sed -n 3p "$STAMP")" != "flux_dump=$PKG" ]; then
    install_pkg || die "pip install ./python into $VENV"
    sed -i "3s/.*/flux_dump=$PKG/" "$STAMP"
    say "flux_dump reinstalled (python/ changed)"
  fi
  place_old
  say "up to date in $(($(date +%s) - START)) s: $VENV ($(sed -n 2p "$STAMP"))"
  exit 0
fi

say "building $VENV with $PYBIN (Python $pyver): $SPEC"
rm -rf "$VENV" || die "cannot remove the old $VENV"
run "$PYBIN" -m venv "$VENV" || die "$PYBIN -m venv $VENV (Debian: apt-get install python3-venv)"
PIP=("$VENV/bin/pip" --disable-pip-version-check)
export PIP_FIND_LINKS=   # the machine's own find-links play no part: the wheelhouse is the cache

# 1. the torch wheel: the CPU index's, else PyPI's
SOURCE=
if ls "$WHCPU"/torch-"$TORCH_VERSION"*.whl >/dev/null 2>&1; then
  SOURCE=cpu
elif mkdir -p "$WHCPU" && run "${PIP[@]}" download --no-deps --index-url "$CPU_INDEX" --timeout 10 --retries 0 \
       -d "$WHCPU" "torch==$TORCH_VERSION"; then
  SOURCE=cpu
fi
if [ "$SOURCE" = cpu ]; then
  TORCH_WHEEL=$(ls "$WHCPU"/torch-"$TORCH_VERSION"*.whl | head -n 1)
  say "torch: the CPU-only wheel of PyTorch's CPU index ($(basename "$TORCH_WHEEL"), $(du -m "$TORCH_WHEEL" | cut -f1) MB)"
else
  say "torch: PyTorch's CPU index cannot be reached; using PyPI's torch $TORCH_VERSION (the CUDA build, runs on the CPU; its CUDA libraries come from PyPI)"
  if ! ls "$WH"/torch-"$TORCH_VERSION"-*.whl >/dev/null 2>&1; then
    run "${PIP[@]}" download --no-deps -d "$WH" "torch==$TORCH_VERSION" || die "pip download torch==$TORCH_VERSION from PyPI"
  fi
  TORCH_WHEEL=$(ls "$WH"/torch-"$TORCH_VERSION"-*.whl | head -n 1)
  SOURCE=pypi
fi

# 2. torch's own requirements, read from its wheel (markers evaluated here), less the GPU-only ones
mapfile -t DEPS < <("$VENV/bin/python" - "$TORCH_WHEEL" "$FULL" "$GPU_ONLY_DEPS" <<'PY'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
z = zipfile.ZipFile(sys.argv[1]); full = sys.argv[2] == "1"; gpu_only = set(sys.argv[3].split())
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist:"):
        r = Requirement(line.split(":", 1)[1].strip())
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        if not full and canonicalize_name(r.name) in gpu_only:
            continue
        r.marker = None
        print(r)
PY
) || die "reading the requirements of $(basename "$TORCH_WHEEL")"
[ ${#DEPS[@]} -gt 0 ] || die "no requirements read from $(basename "$TORCH_WHEEL")"
REQS=("${DEPS[@]}" "diffusers==$DIFFUSERS_VERSION" "${PINS[@]}")

# 3. install from the wheelhouse; download into it only what it lacks
if ! run "${PIP[@]}" install --no-index --find-links "$WH" "${REQS[@]}"; then
  say "downloading into $CACHE (once)"
  run "${PIP[@]}" download -d "$WH" "${REQS[@]}" || die "pip download of torch's requirements, diffusers, ${PINS[*]}"
  run "${PIP[@]}" install --no-index --find-links "$WH" "${REQS[@]}" || die "pip install from $WH"
fi
run "${PIP[@]}" install --no-deps --no-index "$TORCH_WHEEL" || die "pip install $(basename "$TORCH_WHEEL")"
install_pkg || die "pip install ./python into $VENV"

# 4. it works: the pins import, both transformers are there, gloo is built in
got=$("$VENV/bin/python" -c "$VERIFY" 2>>"$LOG") || die "the venv does not import torch $TORCH_VERSION / diffusers $DIFFUSERS_VERSION / flux_dump"
case $SOURCE in
  cpu) src="torch $got from PyTorch's CPU index (CPU-only wheel)" ;;
  *) src="torch ${got%% *} from PyPI (CUDA build, on the CPU), diffusers ${got##* }$([ $FULL -eq 1 ] && echo ', full' || echo ', without triton/cuda-bindings')" ;;
esac
{ echo "$SPEC"; echo "$src"; echo "flux_dump=$PKG"; "$VENV/bin/pip" freeze 2>/dev/null; } >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP" ||
  die "writing $STAMP"
place_old
say "ready in $(($(date +%s) - START)) s: $VENV ($src; $(du -sm "$VENV" | cut -f1) MB; wheelhouse $(du -sm "$CACHE" | cut -f1) MB)"
