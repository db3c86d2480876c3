#!/usr/bin/env bash
# Create (or use) the Python environment of one tested stack and install whatever is missing.
# Idempotent: a second run checks and returns in seconds. Used by `make demo` and `make test`.
#
#   STACK=newest (default)   torch 2.13.0 + torchvision 0.28.0 (requirements/torch.txt), the rest
#                            pinned by requirements/constraints.txt, in .venv
#   STACK=torch2.1           torch 2.1.0 + torchvision 0.16.0 (requirements/torch2.1.txt, the release
#                            OpenMMLab's mmcv 2.1.0 wheels for torch 2.1 are built against) + numpy < 2, the rest
#                            pinned by requirements/constraints-torch2.1.txt, in .venv-torch2.1
#
#   - the active virtualenv instead, if one is active; there a supported torch that imports is kept,
#     with the constraints of the stack of its minor version (torch 2.1.x: torch2.1)
#   - mmcv 2.1.0 with its ops: a wheel from PIP_FIND_LINKS or from this script's own cache
#     (~/.cache/deepvit_mm/wheels/torch-<version>/, DEEPVIT_MM_WHEELS to move it), else compiled
#     once (~18 min on 2 cores) into that cache. A wheel built for another torch fails
#     `import mmcv.ops` ("undefined symbol"): such an mmcv is removed and built again, and pip's
#     wheel cache is never used for it (it keys a local build by its source, not by the torch)
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

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
  STAMP="$VIRTUAL_ENV/.deepvit_mm.stamp"
else
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    python3 -m venv "$VENV"
  fi
  PY="$ROOT/$VENV/bin/python"
  STAMP="$ROOT/$VENV/.deepvit_mm.stamp"
fi
PIP=("$PY" -m pip install --disable-pip-version-check)

# Fast path: everything importable at the pinned/supported versions and the install is current.
WANT=$(cat "$ROOT"/requirements/*.txt setup.py deepvit_mm/version.py | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import deepvit_mm, mmcv.ops" 2>/dev/null; then
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
mmcv_ok() { "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" 2>/dev/null; }
if ! mmcv_ok; then
  if "$PY" -m pip show -q mmcv 2>/dev/null; then
    echo "[setup] the installed mmcv does not import with this torch (built for another one?): replacing it"
    "$PY" -m pip uninstall -y -q mmcv
  fi
  TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)')
  CACHE="${DEEPVIT_MM_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/deepvit_mm/wheels}/torch-$TORCH_VER"
  MMCV=(--no-build-isolation --no-cache-dir -c "$CONSTRAINTS" "mmcv==2.1.0")
  if PIP_FIND_LINKS="$CACHE ${PIP_FIND_LINKS:-}" "${PIP[@]}" -q --only-binary mmcv "${MMCV[@]}" \
      2>/dev/null && mmcv_ok; then
    echo "[setup] mmcv 2.1.0 installed from a wheel (PIP_FIND_LINKS or $CACHE)"
  else
    "$PY" -m pip uninstall -y -q mmcv 2>/dev/null || true
    echo "[setup] compiling mmcv 2.1.0 with ops for torch $TORCH_VER (~18 min on 2 cores, once: the wheel is kept in $CACHE)"
    mkdir -p "$CACHE"
    rm -f "$CACHE"/mmcv-*.whl
    MMCV_WITH_OPS=1 FORCE_CUDA="${FORCE_CUDA:-0}" MAX_JOBS="${MAX_JOBS:-2}" PIP_FIND_LINKS= \
      "$PY" -m pip wheel --disable-pip-version-check --no-deps -w "$CACHE" "${MMCV[@]}"
    PIP_FIND_LINKS="$CACHE" "${PIP[@]}" --only-binary mmcv "${MMCV[@]}"
    mmcv_ok || { echo "[setup] mmcv 2.1.0 was built but 'import mmcv.ops' fails" >&2; exit 1; }
  fi
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
echo "$WANT" > "$STAMP"
echo "[setup] done in $(( $(date +%s) - t0 )) s"
