#!/usr/bin/env bash
# Start training on a day's partition as soon as its conversion has finished.
# Blocks (up to WAIT_TIMEOUT seconds) until dataset_info.json appears; exits 1
# at once if the conversion failed (_FAILURE.json) and on timeout.
#
#   train_when_ready.sh [YYYY-MM-DD]
#
# Environment: OUTPUT_ROOT (as for convert_daily.sh), WAIT_TIMEOUT (default
# 21600 = 6 h), WAIT_POLL (default 30 s), TRAIN (default: examples/train.py),
# PYTHON, RECORDPREP. Extra arguments go to the training script.
set -euo pipefail

DT="${1:-$(date -u -d yesterday +%F)}"
shift || true
: "${OUTPUT_ROOT:?set OUTPUT_ROOT}"
RECORDPREP="${RECORDPREP:-recordprep}"
PYTHON="${PYTHON:-python}"
TRAIN="${TRAIN:-$(dirname "$0")/../train.py}"
OUT="${OUTPUT_ROOT}/dt=${DT}"

"${RECORDPREP}" wait "${OUT}" --timeout "${WAIT_TIMEOUT:-21600}" --poll "${WAIT_POLL:-30}"
exec "${PYTHON}" "${TRAIN}" "${OUT}" "$@"
