#!/usr/bin/env bash
# Create (or use) the Python environment and install whatever is missing. Idempotent: a second
# run checks and returns in seconds. Used by `make demo` and `make test`.
#
#   - the active virtualenv if one is active, else .venv in the repo root (created here)
#   - torch 2.13.0 + torchvision 0.28.0, unless a supported torch that imports is already there
#   - mmcv 2.1.0 with its ops: a wheel from PIP_FIND_LINKS or from this script's own cache
#     (~/.cache/deepvit_mm/wheels/torch-<version>/, DEEPVIT_MM_WHEELS to move it), else compiled
#     once (~18 min on 2 cores) into that cache, so the next set-up (a new clone or virtualenv
#     on the same machine) installs the wheel in seconds
#   - this package (editable) with mmengine, mmdet, mmseg, timm... and its tests and deploy
#     extras (pytest, ruff, ...; onnx, onnxruntime, onnxscript), pinned by
#     requirements/constraints.txt
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CONSTRAINTS="$ROOT/requirements/constraints.txt"

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    python3 -m venv .venv
  fi
  PY="$ROOT/.venv/bin/python"
fi
PIP=("$PY" -m pip install --disable-pip-version-check)

# Fast path: everything importable at the pinned/supported versions and the install is current.

[ -n "${VIRTUAL_ENV:-}" ] && STAMP="$VIRTUAL_ENV/.deepvit_mm.stamp" || STAMP="$ROOT/.venv/.deepvit_mm.stamp"
WANT=$(cat "$CONSTRAINTS" setup.py | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import deepvit_mm" 2>/dev/null; then
  exit 0
fi

t0=$(date +%s)
"${PIP[@]}" -q -c "$CONSTRAINTS" "setuptools>=77,<81" wheel

# torch: keep a supported one that works (torchvision's compiled ops included), else install.
if "$PY" - <<'PYEOF' 2>/dev/null
import sys, torch, torchvision
from torchvision.ops import nms
v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2])
sys.exit(0 if (2, 1) <= v < (2, 14) else 1)
PYEOF
then
  echo "[setup] keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
  grep -v -E '^(torch|torchvision)[=<>!~]' "$CONSTRAINTS" > "$ROOT/.venv-constraints.txt" || true
  CONSTRAINTS="$ROOT/.venv-constraints.txt"
else
  echo "[setup] installing torch 2.13.0 + torchvision 0.28.0"
  "${PIP[@]}" -c "$CONSTRAINTS" "torch===2.13.0" "torchvision==0.28.0"
fi

# mmcv with compiled ops, against the torch now installed (hence no build isolation). A wheel
# fits only the torch it was built against: the cache has a folder per torch version.
if ! "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" 2>/dev/null; then
  TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)')
  CACHE="${DEEPVIT_MM_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/deepvit_mm/wheels}/torch-$TORCH_VER"
  MMCV=(--no-build-isolation -c "$CONSTRAINTS" "mmcv==2.1.0")
  if PIP_FIND_LINKS="$CACHE ${PIP_FIND_LINKS:-}" "${PIP[@]}" -q --only-binary mmcv "${MMCV[@]}" \
      2>/dev/null; then
    echo "[setup] mmcv 2.1.0 installed from a wheel (PIP_FIND_LINKS or $CACHE)"
  else
    echo "[setup] compiling mmcv 2.1.0 with ops (~18 min on 2 cores, once: the wheel is kept in $CACHE)"
    mkdir -p "$CACHE"
    MMCV_WITH_OPS=1 FORCE_CUDA="${FORCE_CUDA:-0}" MAX_JOBS="${MAX_JOBS:-2}" \
      "$PY" -m pip wheel --disable-pip-version-check --no-deps -w "$CACHE" "${MMCV[@]}"
    PIP_FIND_LINKS="$CACHE" "${PIP[@]}" --only-binary mmcv "${MMCV[@]}"
  fi
fi

echo "[setup] installing deepvit_mm and its dependencies"
"${PIP[@]}" -q -c "$CONSTRAINTS" -e ".[tests,deploy]"
"$PY" -c "import deepvit_mm; print('[setup] deepvit_mm', deepvit_mm.__version__, 'ready')"
echo "$WANT" > "$STAMP"
echo "[setup] done in $(( $(date +%s) - t0 )) s"
