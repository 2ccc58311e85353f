#!/usr/bin/env bash
# Parity stage: build the reference chattts==0.2.5 virtualenv used by tests/parity (idempotent, CI-safe).
# Usage: bash tests/parity/build_ref_venv.sh [--force]
# Env: CHATTTS_REF_VENV (target dir, default ~/.cache/chattts_velocity/ref-venv),
#      CHATTTS_REF_PYTHON (interpreter that creates the venv, default python3).
# Exit 0 = venv ready (marker file matches the pinned requirements); non-zero = failure, reason on stderr.
set -euo pipefail

VENV="${CHATTTS_REF_VENV:-$HOME/.cache/chattts_velocity/ref-venv}"
PYTHON="${CHATTTS_REF_PYTHON:-python3}"
MARKER="$VENV/.chattts_ref_ready"
FREEZE="$VENV/ref-freeze.txt"

# The reference stack, pinned. vector-quantize-pytorch must stay within 1.18.5-1.25.2 (later versions change the GFSQ codes).
REQUIREMENTS=(
    "torch==2.11.0"
    "torchaudio==2.11.0"
    "transformers==4.57.6"
    "vocos==0.1.0"
    "vector-quantize-pytorch==1.25.2"
    "pybase16384"
    "numba"
    "requests"
    "chattts==0.2.5"
)

fail() {
    echo "build_ref_venv: ERROR: $*" >&2
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 || fail "interpreter '$PYTHON' not found (set CHATTTS_REF_PYTHON)"
PY_VERSION="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
    || fail "cannot run '$PYTHON'"
WANT_HASH="$(printf '%s\n' "python$PY_VERSION" "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"

MODULES="ChatTTS vocos vector_quantize_pytorch torch torchaudio transformers pybase16384"

# Cheap check for the up-to-date path: every module is findable (no import, which takes seconds).
smoke_test() {
    "$VENV/bin/python" -c \
        'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
        $MODULES 2>/dev/null
}

import_test() {
    "$VENV/bin/python" -c 'import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]' $MODULES
}

if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT_HASH" ]] && smoke_test; then
    echo "build_ref_venv: up to date: $VENV"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
# One builder at a time: parallel test sessions may all ask for the venv.
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 1800 9 || fail "timed out waiting for another build holding $VENV.lock"
    if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT_HASH" ]] && smoke_test; then
        echo "build_ref_venv: built by a concurrent run: $VENV"
        exit 0
    fi
fi

if [[ -e "$VENV" ]]; then
    # Only ever delete something that is recognisably a venv.
    [[ -f "$VENV/pyvenv.cfg" ]] || fail "$VENV exists and is not a virtualenv; remove it or set CHATTTS_REF_VENV"
    rm -rf "$VENV"
fi

start=$(date +%s)
echo "build_ref_venv: creating $VENV with $PYTHON ($PY_VERSION)"
"$PYTHON" -m venv "$VENV" || fail "python -m venv failed (is the venv module installed?)"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Drop pip's noise about this machine's absent local find-links folders; keep everything else.
"$VENV/bin/pip" install --no-input -q "${REQUIREMENTS[@]}" </dev/null 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } \
    || fail "pip install of the reference stack failed (see pip output above)"
import_test || fail "reference venv built but importing one of ($MODULES) fails in $VENV"
"$VENV/bin/pip" freeze >"$FREEZE"
echo "$WANT_HASH" >"$MARKER"
echo "build_ref_venv: ready in $(( $(date +%s) - start ))s: $VENV (versions in $FREEZE)"
