"""An Airflow DAG: convert each day's partition, then train on it.

The conversion runs ahead of training (here on Dataflow); the training task
does not trust the scheduler's ordering alone but blocks on the output's
completion marker with ``recordprep wait``, so a retried or backfilled
conversion, or one started by another system, is handled the same way.
Both tasks are idempotent: re-running a finished day does nothing.

Copy into your DAGs folder and adjust the variables. Airflow is not a
dependency of recordprep; this file only imports it when Airflow loads it.
"""

from __future__ import annotations

import datetime as dt

from airflow import DAG
from airflow.operators.bash import BashOperator

INPUT_ROOT = "gs://my-bucket/events"
OUTPUT_ROOT = "gs://my-bucket/tfrecords"
CONFIG = "/opt/recordprep/features.yaml"
ANALYSIS_FROM = "gs://my-bucket/tfrecords/reference"  # vocabularies/statistics shared by every day
DATAFLOW = "-- --runner DataflowRunner --project my-project --region europe-west1 --temp_location gs://my-bucket/tmp"

with DAG(
    dag_id="recordprep_daily",
    start_date=dt.datetime(2026, 11, 1),
    schedule="30 1 * * *",
    catchup=True,  # backfills are safe: each day is its own partition
    max_active_runs=3,
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=10)},
) as dag:
    convert = BashOperator(
        task_id="convert",
        bash_command=(
            "recordprep convert --input '" + INPUT_ROOT + "/dt={{ ds }}/*' --config " + CONFIG
            + " --output " + OUTPUT_ROOT + "/dt={{ ds }} --analysis-from " + ANALYSIS_FROM + " " + DATAFLOW
        ),
    )
    wait = BashOperator(
        task_id="wait_for_dataset",
        bash_command="recordprep wait " + OUTPUT_ROOT + "/dt={{ ds }} --timeout 21600 --poll 60",
    )
    train = BashOperator(
        task_id="train",
        bash_command="python /opt/recordprep/examples/train.py " + OUTPUT_ROOT + "/dt={{ ds }} --steps 20000",
    )
    convert >> wait >> train
