#!/usr/bin/env bash
# Create (or use) the Python environment of one tested stack and install whatever is missing.
# Idempotent: a second run checks the stamp of the last one and returns in a quarter of a second. Used by `make demo` and `make test`.
#
#   STACK=newest (default)   torch 2.14.1 + torchvision 0.29.1 (requirements/torch.txt), the rest
#                            pinned by requirements/constraints.txt, in .venv
#   STACK=torch2.1           torch 2.1.0 + torchvision 0.16.0 (requirements/torch2.1.txt, the release
#                            OpenMMLab's mmcv 2.1.0 wheels for torch 2.1 are built against) + numpy < 2, the rest
#                            pinned by requirements/constraints-torch2.1.txt, in .venv-torch2.1
#
#   PYTHON=python3.12        the interpreter the virtualenv is made with (default: python3); each
#                            stack takes the Pythons of deepvit_mm/version.py's PYTHONS (newest:
#                            3.10 to 3.13, torch2.1: 3.10 and 3.11), any other stops at once. A
#                            virtualenv made by another Python than the one named is made again;
#                            with none named, one that works is kept (and said so if python3 is
#                            another).
#
#   - the active virtualenv instead, if one is active; there a supported torch that imports is kept,
#     with the constraints of the stack of its minor version (torch 2.1.x: torch2.1)
#   - mmcv 2.1.0 with its ops: a wheel from PIP_FIND_LINKS or from this script's own cache
#     (~/.cache/deepvit_mm/wheels/torch-<version>[-sm_<arch>]/, DEEPVIT_MM_WHEELS to move it), else
#     compiled once (~18 min on 2 cores; with CUDA ops ~28 min an arch) into that cache, from the
#     registry's source with mmcv's
#     get_version mended for Python 3.13, its -std=c++17 raised to C++20 for torch >= 2.14 (whose
#     headers refuse anything older), and setuptools < 82 while it builds (its setup.py imports
#     pkg_resources; the stack's own setuptools is put back after). A wheel built for another torch fails
#     `import mmcv.ops` ("undefined symbol"): such an mmcv is removed and built again, and pip's
#     wheel cache is never used for it (it keys a local build by its source, not by the torch)
#   - mmcv's CUDA ops where torch is a CUDA build and sees a GPU, or with FORCE_CUDA=1: the nvcc
#     of torch's CUDA (the machine's, else the registry's for the build only), torch's own CUDA
#     headers, and the archs of the visible GPUs or of MMCV_CUDA_ARCH (tools/mmcv_build.py says
#     how each is found); the wheel is checked for them (on the GPU where there is one)
#   - this package (editable) with mmengine, mmdet, mmseg, timm... and its tests and deploy extras,
#     pinned by the stack's constraints; torch, torchvision and mmcv are checked to be unchanged
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STACK=${STACK:-newest}
case "$STACK" in
  newest)   CONSTRAINTS="$ROOT/requirements/constraints.txt"; TORCH="$ROOT/requirements/torch.txt"; VENV=.venv ;;
  torch2.1) CONSTRAINTS="$ROOT/requirements/constraints-torch2.1.txt"; TORCH="$ROOT/requirements/torch2.1.txt"
            VENV=.venv-torch2.1 ;;
  *) echo "[setup] unknown STACK=$STACK: use newest or torch2.1" >&2; exit 2 ;;
esac

# The interpreter: the active virtualenv's, else PYTHON's. Checked against the stack's Pythons
# (version.py's PYTHONS, read as a literal: nothing is imported) before anything is made.
python_check() {  # $1: interpreter; prints its X.Y, or one line of what is wrong and fails
  "$1" - "$STACK" "$ROOT/deepvit_mm/version.py" <<'PYEOF'
import ast, sys
stack, path = sys.argv[1:]
tables = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(open(path).read()).body
          if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'PYTHONS'}
lo, hi = (tuple(int(x) for x in v.split('.')) for v in tables['PYTHONS'][stack])
here = sys.version_info[:2]
if lo <= here < hi:
    print('%d.%d' % here)
    sys.exit(0)
print('[setup] Python %d.%d (%s) cannot set up STACK=%s: it takes Python %d.%d to %d.%d; name one, '
      'e.g. make setup PYTHON=python%d.%d' % (here + (sys.executable, stack) + lo + (hi[0], hi[1] - 1)
                                              + (hi[0], hi[1] - 1)))
sys.exit(2)
PYEOF
}
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
  STAMP="$VIRTUAL_ENV/.deepvit_mm.stamp"
  if ! WHY=$(python_check "$PY"); then echo "$WHY (the active virtualenv's)" >&2; exit 2; fi
else
  NAMED=${PYTHON:+1}
  PYTHON=${PYTHON:-python3}
  version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none; }
  HAVE_PY=none
  [ ! -e "$VENV" ] || HAVE_PY=$(version_of "$VENV/bin/python")
  if [ -z "$NAMED" ] && [ "$HAVE_PY" != none ] && python_check "$VENV/bin/python" >/dev/null; then
    # no Python named: the virtualenv there is kept, whichever Python of the stack's made it
    WANT_PY=$HAVE_PY
    if [ "$(version_of "$PYTHON")" != "$HAVE_PY" ]; then
      echo "[setup] keeping $VENV, made by Python $HAVE_PY ($PYTHON is $(version_of "$PYTHON")); make setup PYTHON=$PYTHON makes it again with that one"
    fi
  else
    if ! command -v "$PYTHON" >/dev/null || ! "$PYTHON" -c '' 2>/dev/null; then
      echo "[setup] no working Python interpreter '$PYTHON': name one with PYTHON=, e.g. make setup PYTHON=python3.12" >&2
      exit 2
    fi
    if ! WANT_PY=$(python_check "$PYTHON"); then echo "$WANT_PY" >&2; exit 2; fi
    if [ -e "$VENV" ] && [ "$HAVE_PY" != "$WANT_PY" ]; then
      echo "[setup] $VENV was made by Python $HAVE_PY, not $WANT_PY ($PYTHON): making it again"
      [ -z "${SETUP_CHECK_ONLY:-}" ] || exit 0
      rm -rf "$VENV"
    fi
  fi
  # SETUP_CHECK_ONLY=1: say which interpreter and virtualenv would be used, and change nothing
  [ -z "${SETUP_CHECK_ONLY:-}" ] || { echo "[setup] $VENV with Python $WANT_PY"; exit 0; }
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with Python $WANT_PY ($PYTHON)"
    if ! "$PYTHON" -m venv "$VENV"; then
      rm -rf "$VENV"
      echo "[setup] '$PYTHON -m venv' failed (Debian and Ubuntu ship venv apart: apt install python3-venv)" >&2
      exit 1
    fi
  fi
  PY="$ROOT/$VENV/bin/python"
  STAMP="$ROOT/$VENV/.deepvit_mm.stamp"
fi
[ -z "${SETUP_CHECK_ONLY:-}" ] || { echo "[setup] the active virtualenv, $VIRTUAL_ENV"; exit 0; }
PIP=("$PY" -m pip install --disable-pip-version-check)

# Fast path: the last set-up ended here with these requirements, and the environment holds the
# distributions it left, at their versions (any pip install or uninstall since changes them). A
# quarter of a second, where importing deepvit_mm and mmcv.ops to check took seven.
installed() {
  "$PY" -c 'import hashlib, importlib.metadata as m; print(hashlib.sha256("\n".join(sorted(
"%s==%s" % (d.metadata["Name"], d.version) for d in m.distributions())).encode()).hexdigest()[:16])'
}
WANT=$( (cat "$ROOT"/requirements/*.txt setup.py deepvit_mm/version.py
         echo "${FORCE_CUDA:-0} ${MMCV_CUDA_ARCH:-} ${TORCH_CUDA_ARCH_LIST:-}") | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT-$(installed)" ]; then
  exit 0
fi

t0=$(date +%s)
pin() { grep -h -E "^$1[=<>!~]" "$CONSTRAINTS" "$TORCH" | head -1; }
# packaging: deepvit_mm/version.py compares versions with it (read below without the package)
"${PIP[@]}" -q "$(pin setuptools)" "$(pin wheel)" "$(pin packaging)"

# torch: keep a supported one that works (torchvision's compiled ops included), else install the
# stack's. The supported range is read from deepvit_mm/version.py.
if "$PY" - <<'PYEOF' 2>/dev/null
import sys, torch, torchvision
from torchvision.ops import nms
ns = {}
exec(open('deepvit_mm/version.py').read(), ns)
sys.exit(0 if ns['supported']('torch', torch.__version__) else 1)
PYEOF
then
  TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)')
  echo "[setup] keeping torch $TORCH_VER"
  case "$TORCH_VER" in 2.1.*) CONSTRAINTS="$ROOT/requirements/constraints-torch2.1.txt" ;; esac
else
  echo "[setup] installing $(pin torch) $(pin torchvision) ($STACK)"
  # numpy and opencv with them: mmcv's unbounded opencv-python would otherwise pull numpy 2,
  # which torch 2.1 cannot use
  "${PIP[@]}" -c "$CONSTRAINTS" -r "$TORCH" "$(pin numpy)" "$(pin opencv-python)"
fi

# mmcv with compiled ops, against the torch now installed (hence no build isolation).
# mmcv 2.1.0's setup.py imports pkg_resources (gone from setuptools 82): it builds with this one,
# and the stack's setuptools is put back after.
MMCV_BUILD_SETUPTOOLS="setuptools==80.8.0"
build_mmcv() {  # $1: the folder the wheel goes to
  local work src
  work=$(mktemp -d)
  "${PIP[@]}" -q "$MMCV_BUILD_SETUPTOOLS"
  # pip fetches and unpacks the registry's source (its hash checked) and keeps it (--no-clean),
  # whether or not its setup.py then runs: on Python 3.13 it stops at get_version, which reads
  # __version__ from locals() after an exec, and since PEP 667 locals() no longer sees it
  TMPDIR="$work" PIP_FIND_LINKS= "$PY" -m pip download --disable-pip-version-check --no-clean \
    --no-deps --no-build-isolation --no-binary mmcv -d "$work/sdist" "mmcv==2.1.0" \
    >"$work/download.log" 2>&1 || true
  src=$(find "$work" -mindepth 3 -maxdepth 3 -path '*/mmcv*/setup.py' -printf '%h\n' | head -1)
  if [ -z "$src" ] && [ -f "$work/sdist/mmcv-2.1.0.tar.gz" ]; then
    tar -xzf "$work/sdist/mmcv-2.1.0.tar.gz" -C "$work" && src="$work/mmcv-2.1.0"
  fi
  [ -n "$src" ] || { cat "$work/download.log" >&2; echo "[setup] could not fetch mmcv 2.1.0's source" >&2; exit 1; }
  # get_version for Python 3.13, -std=c++20 for torch >= 2.14 (tools/mmcv_build.py says why)
  "$PY" "$ROOT/tools/mmcv_build.py" mend "$src/setup.py"
  # a CUDA build: nvcc (the registry's installed into $work/cuda where none here fits), CPATH
  local cuda_env=''
  if [ -n "$CUDA_PLAN" ]; then
    cuda_env=$("$PY" "$ROOT/tools/mmcv_build.py" cuda-toolkit --prefix "$work/cuda") || exit 2
  fi
  (eval "$cuda_env"
   MMCV_WITH_OPS=1 FORCE_CUDA="${FORCE_CUDA:-0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" PIP_FIND_LINKS= \
     "$PY" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation --no-cache-dir \
     -w "$1" "$src")
  "${PIP[@]}" -q "$(pin setuptools)"
  rm -rf "$work"
}
# A CUDA build (torch is a CUDA build and sees a GPU, or FORCE_CUDA=1): FORCE_CUDA,
# TORCH_CUDA_ARCH_LIST and MMCV_ARCH_KEY (the wheel cache's key) exported; nothing for the CPU.
# Where it cannot be had, one line says what to install.
CUDA_PLAN=$("$PY" "$ROOT/tools/mmcv_build.py" cuda-plan) || exit 2
eval "$CUDA_PLAN"
mmcv_ok() { "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" 2>/dev/null; }
# a CUDA build: the installed mmcv's ops were compiled with torch's CUDA
mmcv_cuda_ok() { [ -z "$CUDA_PLAN" ] || "$PY" "$ROOT/tools/mmcv_build.py" cuda-built; }
# its compiled ops run and give what they must (nms, RoIAlign forward and backward; a CUDA build:
# on the GPU against the CPU where one is visible, its device code listed for the archs asked)
mmcv_ops_ok() { "$PY" "$ROOT/tools/mmcv_build.py" check ${CUDA_PLAN:+--cuda-arch "$TORCH_CUDA_ARCH_LIST"}; }
if ! mmcv_ok || ! mmcv_cuda_ok; then
  if mmcv_ok; then
    echo "[setup] the installed mmcv has no CUDA ops of torch's CUDA (built for the CPU?): replacing it"
    "$PY" -m pip uninstall -y -q mmcv
  elif "$PY" -m pip show -q mmcv 2>/dev/null; then
    echo "[setup] the installed mmcv does not import with this torch (built for another one?): replacing it"
    "$PY" -m pip uninstall -y -q mmcv
  fi
  TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)')
  CACHE="${DEEPVIT_MM_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/deepvit_mm/wheels}/torch-$TORCH_VER${MMCV_ARCH_KEY:+-$MMCV_ARCH_KEY}"
  MMCV=(--no-build-isolation --no-cache-dir -c "$CONSTRAINTS" "mmcv==2.1.0")
  # a CUDA build takes its wheel from its own cache only: PIP_FIND_LINKS' wheels of the same
  # name are CPU builds
  LINKS="$CACHE ${PIP_FIND_LINKS:-}"
  [ -z "$CUDA_PLAN" ] || LINKS="$CACHE"
  if PIP_FIND_LINKS="$LINKS" "${PIP[@]}" -q --only-binary mmcv "${MMCV[@]}" \
      2>/dev/null && mmcv_ok && mmcv_cuda_ok; then
    echo "[setup] mmcv 2.1.0 installed from a wheel ($LINKS)"
  else
    "$PY" -m pip uninstall -y -q mmcv 2>/dev/null || true
    if [ -n "$CUDA_PLAN" ]; then
      echo "[setup] compiling mmcv 2.1.0 with CUDA ops for torch $TORCH_VER, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST (~28 min on 2 cores, once: the wheel is kept in $CACHE; it runs on GPUs of these archs only)"
    else
      echo "[setup] compiling mmcv 2.1.0 with ops for torch $TORCH_VER (~18 min on 2 cores, once: the wheel is kept in $CACHE)"
    fi
    mkdir -p "$CACHE"
    rm -f "$CACHE"/mmcv-*-"$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"-*.whl
    build_mmcv "$CACHE"
    PIP_FIND_LINKS="$CACHE" "${PIP[@]}" --only-binary mmcv "${MMCV[@]}"
    mmcv_ok || { echo "[setup] mmcv 2.1.0 was built but 'import mmcv.ops' fails" >&2; exit 1; }
    mmcv_cuda_ok || { echo "[setup] mmcv 2.1.0 was built without CUDA ops" >&2; exit 1; }
  fi
  mmcv_ops_ok
fi

# deepvit_mm and the rest; then the check that it changed none of torch, torchvision and mmcv
# (the README's path into an existing environment promises it)
core() { "$PY" -m pip list --format=freeze 2>/dev/null | grep -i -E '^(torch|torchvision|mmcv)==' ; }
BEFORE=$(core)
echo "[setup] installing deepvit_mm and its dependencies"
"${PIP[@]}" -q -c "$CONSTRAINTS" -e ".[all,tests,deploy]"
if [ "$(core)" != "$BEFORE" ]; then
  echo "[setup] installing deepvit_mm changed torch/torchvision/mmcv: $BEFORE -> $(core)" >&2
  exit 1
fi
"$PY" -c "import deepvit_mm; print('[setup] deepvit_mm', deepvit_mm.__version__, 'ready')"
echo "$WANT-$(installed)" > "$STAMP"
echo "[setup] done in $(( $(date +%s) - t0 )) s"
