#!/usr/bin/env bash
# Build .venv-sglang-VERSION: a pinned upstream sglang release, installed without its
# declared dependencies, plus the ~20 small packages its KV bookkeeping actually imports.
#
#   adapters/sglang/make_env.sh 0.5.15      # wrapper era (the seed's release)
#   adapters/sglang/make_env.sh 0.5.23      # borrow era
#
# torch is ALWAYS pinned (TORCH_SPEC, default torch==2.13.0): sglang's wheel metadata pins
# another torch (2.11 / 2.14.1) and pip must never resolve it. Idempotent: a venv with a
# matching stamp is left alone (FORCE=1 rebuilds). Prints the elapsed time.
set -euo pipefail

VERSION="${1:?usage: make_env.sh VERSION  (e.g. 0.5.15 or 0.5.23)}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TRITON_SPEC="${TRITON_SPEC:-triton==3.9.0}"
VENV="${VENV_DIR:-$ROOT/.venv-sglang-$VERSION}"
STAMP="$VENV/.kvcheck-sglang-$VERSION"
start=$(date +%s)

if [[ -f "$STAMP" && -z "${FORCE:-}" ]]; then
    echo "$VENV: already built (FORCE=1 to rebuild)"
    exit 0
fi

case "$TORCH_SPEC" in
    torch==*) ;;
    *) echo "make_env.sh: TORCH_SPEC must pin an exact torch (torch==X), got '$TORCH_SPEC'" >&2; exit 2 ;;
esac

# The small real dependencies (all --no-deps). Found by import-and-read-the-error;
# einops is needed by 0.5.15 only (layers.moe -> moe_runner.deep_gemm), harmless elsewhere.
DEPS=(psutil numpy msgspec orjson pybase64 requests urllib3 idna certifi packaging
      pillow starlette anyio pydantic pydantic_core typing_inspection annotated_types
      pyzmq tqdm dill einops)

# Real triton: 0.5.11-0.5.21 launch Triton kernels in the paged allocator (page_size > 1),
# which run on the CPU under TRITON_INTERPRET=1 (run_trace.py sets it). 0.5.15 also
# cannot import with a stubbed triton (layers/attention/fla/utils.py reads the driver at
# import time). 0.5.22+ import it but never launch a kernel; installed anyway for one
# uniform environment (WITH_TRITON=0 skips it; the adapter then stubs triton).
WITH_TRITON="${WITH_TRITON:-1}"

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# --no-compile: only what the adapter imports gets compiled, at its first import (about
# 25 CPU-s less per torch install; most of sglang is never imported)
INSTALL=("$VENV/bin/python" -m pip -q --disable-pip-version-check install --no-compile)
"${INSTALL[@]}" "$TORCH_SPEC"
"${INSTALL[@]}" --no-deps "sglang==$VERSION"
"${INSTALL[@]}" --no-deps "${DEPS[@]}"
if [[ "$WITH_TRITON" == 1 ]]; then
    "${INSTALL[@]}" --no-deps "$TRITON_SPEC"
fi
# `kvcheck coverage --backend sglang:V` runs the adapter's server under coverage.py
"${INSTALL[@]}" --no-deps "coverage==7.17.3"
# Guard: nothing above may have replaced torch.
got=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
want="${TORCH_SPEC#torch==}"
if [[ "$got" != "$want" ]]; then
    echo "make_env.sh: torch $got in $VENV, expected $want" >&2
    exit 1
fi
"$VENV/bin/python" - "$VERSION" <<'PY'
import importlib.metadata as md, sys
v = md.version("sglang")
assert v == sys.argv[1], f"sglang {v} installed, {sys.argv[1]} asked"
print(f"sglang {v}, torch {md.version('torch')}, triton {md.version('triton') if any(d.metadata['Name']=='triton' for d in md.distributions()) else '-'}")
PY
echo "$VERSION" > "$STAMP"
echo "$VENV built in $(( $(date +%s) - start )) s"
