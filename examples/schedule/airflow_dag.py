"""Two Airflow DAGs, as the crontab beside this file: convert each day's partition, and train on it.

``recordprep_convert`` converts day ``ds`` ahead of training (locally, or on
Dataflow with Beam flags). ``recordprep_train`` does not trust the
scheduler's ordering: it blocks on the output's completion marker with
``recordprep wait``, so a conversion run late, retried, backfilled or started
by another system is handled the same way, and it may live in another
Airflow. Both are idempotent: re-running or backfilling a finished day does
nothing ("already complete").

A conversion killed mid-run (-9, a lost worker) writes nothing, but its lock
stops beating: the wait fails at once naming the dead run, the ``convert``
task's retry takes over its output (no ``--overwrite``), and the wait's retry
follows that run to the end. Retries wait ``[core] default_task_retry_delay``
(Airflow's setting, 300 s unless changed).

The tasks run the ``recordprep`` CLI and the training script as commands, so
Airflow's environment never imports recordprep or TensorFlow. Set these
Airflow Variables (or ``AIRFLOW_VAR_<NAME>`` environment variables):

=============================  ============================================================
recordprep_input_root          where partitions land: ``ROOT/dt=YYYY-MM-DD/*`` (required)
recordprep_output_root         converted partitions go to ``ROOT/dt=YYYY-MM-DD/`` (required)
recordprep_config              the feature config, features.yaml (required)
recordprep_analysis_from       an output whose vocabularies/statistics every day reuses
recordprep_beam_args           Beam flags, e.g. ``--runner DataflowRunner --project P ...``
recordprep_bin                 the CLI (default: ``recordprep`` on the worker's PATH)
recordprep_wait_timeout        seconds ``wait`` blocks before failing (default 21600)
recordprep_wait_poll           seconds between its checks (default 60)
recordprep_stale_after         seconds without a heartbeat before a run counts as dead
                               (default: the run's own limit; more than its 10 s period)
recordprep_python              the training job's interpreter (default: ``python``)
recordprep_train_script        default: ``/opt/recordprep/examples/train.py``
recordprep_train_args          default: ``--steps 20000``
recordprep_drift_against       drift gate before training (off when empty): ``previous`` (the
                               day before's partition; while it is not complete, only the day's
                               own splits are compared) or an output path; the ``check_drift``
                               task runs ``recordprep report --fail-on-drift`` and fails, so
                               ``train`` does not run, naming the features over threshold
recordprep_drift_thresholds    e.g. ``js=0.2 linf=0.05``: ``--drift-threshold`` flags (default:
                               the config's ``drift:`` thresholds)
=============================  ============================================================

Copy into your DAGs folder. Airflow is not a dependency of recordprep;
``airflow-requirements.txt`` pins the Airflow these DAGs are tested with.
"""

from __future__ import annotations

import datetime as dt

from airflow import DAG
from airflow.operators.bash import BashOperator

START = dt.datetime(2026, 11, 1)


def _var(name: str, default: str | None = None) -> str:
    """A Jinja reference to Airflow Variable ``recordprep_<name>``; without a default it is required."""
    if default is None:
        return "{{ var.value.recordprep_" + name + " }}"
    return "{{ var.value.get('recordprep_" + name + "', '" + default + "') }}"


OUTPUT = _var("output_root") + "/dt={{ ds }}"
# Values reach bash as environment variables, quoted there: paths may hold spaces.
COMMON_ENV = {"RECORDPREP": _var("bin", "recordprep"), "OUT": OUTPUT}

with DAG(
    dag_id="recordprep_convert",
    start_date=START,
    schedule="30 1 * * *",
    catchup=True,  # backfills are safe: each day is its own partition
    max_active_runs=3,
    default_args={"retries": 2},
) as convert_dag:
    BashOperator(
        task_id="convert",
        env={**COMMON_ENV, "IN": _var("input_root") + "/dt={{ ds }}", "CONFIG": _var("config"),
             "ANALYSIS_FROM": _var("analysis_from", ""), "BEAM_ARGS": _var("beam_args", "")},
        append_env=True,
        bash_command=('"$RECORDPREP" convert --input "$IN/*" --config "$CONFIG" --output "$OUT" '
                      '${ANALYSIS_FROM:+--analysis-from "$ANALYSIS_FROM"} ${BEAM_ARGS:+-- $BEAM_ARGS}'),
    )

with DAG(
    dag_id="recordprep_train",
    start_date=START,
    schedule="0 2 * * *",
    catchup=False,  # a model trains on the latest day; backfill explicitly when wanted
    max_active_runs=1,
    default_args={"retries": 3},  # a dead conversion fails the wait at once; the retries outlast its takeover
) as train_dag:
    wait = BashOperator(
        task_id="wait_for_dataset",
        env={**COMMON_ENV, "TIMEOUT": _var("wait_timeout", "21600"), "POLL": _var("wait_poll", "60"),
             "STALE_AFTER": _var("stale_after", "")},
        append_env=True,
        bash_command=('"$RECORDPREP" wait "$OUT" --timeout "$TIMEOUT" --poll "$POLL" '
                      '${STALE_AFTER:+--stale-after "$STALE_AFTER"}'),
    )
    check = BashOperator(
        task_id="check_drift",
        env={**COMMON_ENV, "AGAINST": _var("drift_against", ""), "THRESHOLDS": _var("drift_thresholds", ""),
             "PREVIOUS": _var("output_root") + "/dt={{ macros.ds_add(ds, -1) }}"},
        append_env=True,
        retries=0,  # drifted data stays drifted: a retry would only repeat the verdict
        bash_command=(
            'if [ -z "$AGAINST" ]; then echo "drift gate off (Variable recordprep_drift_against)"; exit 0; fi; '
            'FLAGS=(); for t in $THRESHOLDS; do FLAGS+=(--drift-threshold "$t"); done; '
            'if [ "$AGAINST" = previous ]; then AGAINST="$PREVIOUS"; '
            '  if ! "$RECORDPREP" wait "$AGAINST" --timeout 0 >/dev/null 2>&1; then '
            '    echo "drift gate: $AGAINST is not a complete output; checking $OUT\'s splits only"; AGAINST=""; fi; fi; '
            '[ -n "$AGAINST" ] && FLAGS+=(--against "$AGAINST"); '
            'exec "$RECORDPREP" report "$OUT" --fail-on-drift "${FLAGS[@]}"'
        ),
    )
    train = BashOperator(
        task_id="train",
        env={**COMMON_ENV, "PYTHON": _var("python", "python"),
             "TRAIN": _var("train_script", "/opt/recordprep/examples/train.py"),
             "TRAIN_ARGS": _var("train_args", "--steps 20000")},
        append_env=True,
        bash_command='"$PYTHON" "$TRAIN" "$OUT" $TRAIN_ARGS',
    )
    wait >> check >> train
