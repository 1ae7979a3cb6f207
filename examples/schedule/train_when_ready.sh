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
#
# Drift gate (off unless DRIFT_AGAINST is set): DRIFT_AGAINST=previous (the day
# before's partition; skipped, with a note, while it is not complete) or an
# output path. Before training, `recordprep report --fail-on-drift` compares the
# day with it (and its train split with its eval split) and exits 1 naming the
# features over their thresholds (the config's `drift:`; DRIFT_THRESHOLDS="js=0.2
# linf=0.05" for this job), so the model does not train on drifted data.
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
if [[ -n "${DRIFT_AGAINST:-}" ]]; then
  AGAINST="${DRIFT_AGAINST}"
  [[ "${AGAINST}" == previous ]] && AGAINST="${OUTPUT_ROOT}/dt=$(date -u -d "${DT} - 1 day" +%F)"
  FLAGS=()
  for t in ${DRIFT_THRESHOLDS:-}; do FLAGS+=(--drift-threshold "$t"); done
  if [[ "${DRIFT_AGAINST}" == previous ]] && ! "${RECORDPREP}" wait "${AGAINST}" --timeout 0 >/dev/null 2>&1; then
    echo "drift gate: ${AGAINST} is not a complete output; checking ${OUT}'s splits only" >&2
  else
    FLAGS+=(--against "${AGAINST}")
  fi
  "${RECORDPREP}" report "${OUT}" --fail-on-drift "${FLAGS[@]}"
fi
exec "${PYTHON}" "${TRAIN}" "${OUT}" "$@"
