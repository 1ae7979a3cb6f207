#!/usr/bin/env bash
# Start training on a day's partition as soon as its conversion has finished.
# Blocks (up to WAIT_TIMEOUT seconds) until dataset_info.json appears; exits 1
# on timeout, and at once if the conversion failed (_FAILURE.json) or is dead
# (killed, or its machine lost: its lock's heartbeat stopped), naming that run.
# The next convert_daily.sh of the day takes over a dead run's output.
#
#   train_when_ready.sh [YYYY-MM-DD]        (default: the day before TODAY)
#
# Environment: OUTPUT_ROOT and TODAY (as for convert_daily.sh), WAIT_TIMEOUT
# (default 21600 = 6 h), WAIT_POLL (default 30 s), WAIT_STALE_AFTER (seconds
# without a heartbeat before the run counts as dead; default: the run's own
# limit), TRAIN (default: examples/train.py), PYTHON, RECORDPREP. Extra
# arguments go to the training script.
set -euo pipefail

if [[ "${1:-}" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]]; then
  DT="$1"; shift
else  # no date given: every argument is for the training script
  DT="$(date -u -d "${TODAY:-today} - 1 day" +%F)"
fi
: "${OUTPUT_ROOT:?set OUTPUT_ROOT}"
RECORDPREP="${RECORDPREP:-recordprep}"
PYTHON="${PYTHON:-python}"
TRAIN="${TRAIN:-$(dirname "$0")/../train.py}"
OUT="${OUTPUT_ROOT}/dt=${DT}"

"${RECORDPREP}" wait "${OUT}" --timeout "${WAIT_TIMEOUT:-21600}" --poll "${WAIT_POLL:-30}" \
  ${WAIT_STALE_AFTER:+--stale-after "${WAIT_STALE_AFTER}"}
exec "${PYTHON}" "${TRAIN}" "${OUT}" "$@"
