#!/usr/bin/env bash
# Run ComfyUI's tests/execution suite against real ComfyUI, or through comfyfleet.
#
#   run_suite.sh MODE [extra pytest args...]
#
# Extra pytest args: e.g. -k NAME, --skip-timing-checks, or node ids
# (tests/execution/test_x.py::Class::test[param]) to run only those.
#
# MODE:
#   baseline  plain ComfyUI (the suite's own fixtures, port 8188)
#   baseline-pack  the same, with comfyfleet's companion pack loaded
#   A         comfyfleet on 8188 + 1 ComfyUI backend (8190)
#   B         comfyfleet on 8188 + 2 ComfyUI backends (8190, 8191)
#   C         comfyfleet alone, built-in engine, --local-slots 8,
#             --custom-nodes <a copy of tests/execution/testing_nodes>
#   C2        as C, but the comfyfleet process also gets PYTHONPATH=
#             c_shim:$COMFYUI_DIR:<COMFY_VENV site-packages>, so that the testing
#             nodes can import torch and comfy.* (c_shim sets ComfyUI's --cpu flag)
#
# Required environment:
#   COMFYUI_DIR   ComfyUI checkout (holds main.py and tests/execution)
#   COMFY_VENV    venv with ComfyUI's requirements + pytest, websocket-client, requests
#   CF_BIN        the comfyfleet executable (A, B, C, C2)
# Optional:
#   OUT_DIR       where junit xml + logs go (default ./results)
#   CF_LABEL      the name of this run's results (default MODE)
#   CF_EXTRA_ARGS more flags for `comfyfleet serve`
#   CF_PACK       1 (default in A, B and baseline-pack): the ComfyUI processes load
#                 comfyfleet's companion pack (installed with CF_BIN into OUT_DIR);
#                 0: they do not
#   C_PYTHONPATH  C only: PYTHONPATH for the comfyfleet process (C2 sets its own)
set -euo pipefail
MODE=${1:?usage: run_suite.sh baseline|baseline-pack|A|B|C|C2|W [pytest args]}
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${COMFYUI_DIR:?set COMFYUI_DIR}" "${COMFY_VENV:?set COMFY_VENV}"
OUT_DIR=${OUT_DIR:-$PWD/results}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LABEL=${CF_LABEL:-$MODE}  # names the results: $OUT_DIR/$LABEL.xml, ...
export CF_LOG_DIR="$OUT_DIR/logs-$LABEL"
rm -rf "$CF_LOG_DIR"; mkdir -p "$CF_LOG_DIR"

# shellcheck disable=SC1091
source "$COMFY_VENV/bin/activate"
cd "$COMFYUI_DIR"

PACK=0
case "$MODE" in
  baseline) export CF_MODE=off ;;
  baseline-pack) export CF_MODE=plain; PACK=${CF_PACK:-1} ;;
  A) export CF_MODE=gateway CF_BACKENDS=1 CF_BACKEND_PORTS=${CF_BACKEND_PORTS:-8190}
     PACK=${CF_PACK:-1} ;;
  B) export CF_MODE=gateway CF_BACKENDS=2 CF_BACKEND_PORTS=${CF_BACKEND_PORTS:-8190,8191}
     PACK=${CF_PACK:-1} ;;
  W) export CF_MODE=worker CF_BACKENDS=1 CF_BACKEND_PORTS=${CF_BACKEND_PORTS:-8190}
     PACK=${CF_PACK:-1} ;;
  C|C2)
    export CF_MODE=builtin CF_LOCAL_SLOTS=${CF_LOCAL_SLOTS:-8}
    NODES_DIR="$OUT_DIR/custom_nodes-C"
    rm -rf "$NODES_DIR"; mkdir -p "$NODES_DIR"
    cp -r tests/execution/testing_nodes/. "$NODES_DIR/"
    export CF_CUSTOM_NODES="$NODES_DIR"
    if [ "$MODE" = C2 ]; then
      SITE=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      C_PYTHONPATH="$HERE/c_shim:$COMFYUI_DIR:$SITE"
    fi
    if [ -n "${C_PYTHONPATH:-}" ]; then export CF_SERVER_PYTHONPATH="$C_PYTHONPATH"; fi
    ;;
  *) echo "unknown MODE $MODE" >&2; exit 2 ;;
esac
if [ "$MODE" != baseline ]; then : "${CF_BIN:?set CF_BIN}"; export CF_BIN; fi
if [ "$PACK" = 1 ]; then
  export CF_PACK_DIR="$OUT_DIR/pack-$LABEL/custom_nodes"
  rm -rf "$OUT_DIR/pack-$LABEL"; mkdir -p "$CF_PACK_DIR"
  "$CF_BIN" install-comfyui-pack "$CF_PACK_DIR" >/dev/null
fi

# The plugin folder goes on PYTHONPATH for pytest only; the ComfyUI servers the plugin
# starts inherit it, which is harmless (it holds no module ComfyUI imports).
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
set +e
# A first extra argument naming tests (tests/...) replaces the default target.
TARGET=(tests/execution)
if [ $# -gt 0 ] && [[ "$1" == tests/* ]]; then TARGET=(); fi
python -m pytest "${TARGET[@]}" -p no:cacheprovider -p cf_gateway_plugin -q -rfE \
  --junitxml="$OUT_DIR/$LABEL.xml" "$@" 2>&1 | tee "$OUT_DIR/$LABEL.log"
rc=${PIPESTATUS[0]}
set -e
echo "MODE=$MODE rc=$rc wall=$(( $(date +%s) - start ))s" | tee -a "$OUT_DIR/$LABEL.log"
python "$HERE/summarize.py" "$OUT_DIR/$LABEL.xml" | tee "$OUT_DIR/$LABEL.summary.txt"
exit "$rc"
