#!/usr/bin/env bash
# Convert one day's partition ahead of training. Safe to run again and again
# (cron retries, Airflow backfills): a finished partition is a no-op, a
# half-written one is never visible to readers (dataset_info.json is written
# last), and a failed one leaves _FAILURE.json that `recordprep wait` reports.
#
#   convert_daily.sh [YYYY-MM-DD]           (default: the day before TODAY)
#
# Environment (defaults suit the bundled example layout):
#   INPUT_ROOT     where partitions land: $INPUT_ROOT/dt=YYYY-MM-DD/*.avro   (local, gs://, hdfs://)
#   OUTPUT_ROOT    where converted partitions go: $OUTPUT_ROOT/dt=YYYY-MM-DD/
#   CONFIG         feature config (features.yaml)
#   ANALYSIS_FROM  a reference output whose vocabularies/statistics every day
#                  reuses, so ids and scaling match the model's training data;
#                  unset = compute them from this day's training split
#   RECORDPREP     the CLI (default: recordprep on PATH)
#   TODAY          the day the job runs on (default: today, UTC); set it to replay a
#                  day or to test the schedule with a simulated clock
#   Extra arguments after the date go to `recordprep convert` (e.g. -- --runner DataflowRunner ...).
set -euo pipefail

if [[ "${1:-}" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]]; then
  DT="$1"; shift
else  # no date given: every argument is for `recordprep convert`
  DT="$(date -u -d "${TODAY:-today} - 1 day" +%F)"
fi
: "${INPUT_ROOT:?set INPUT_ROOT (e.g. gs://bucket/events)}"
: "${OUTPUT_ROOT:?set OUTPUT_ROOT (e.g. gs://bucket/tfrecords)}"
: "${CONFIG:?set CONFIG (a features.yaml)}"
RECORDPREP="${RECORDPREP:-recordprep}"

args=(convert --input "${INPUT_ROOT}/dt=${DT}/*" --config "${CONFIG}" --output "${OUTPUT_ROOT}/dt=${DT}")
if [[ -n "${ANALYSIS_FROM:-}" ]]; then
  args+=(--analysis-from "${ANALYSIS_FROM}")
fi
exec "${RECORDPREP}" "${args[@]}" "$@"
