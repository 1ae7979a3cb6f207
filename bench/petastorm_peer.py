"""Petastorm, the peer that feeds Keras straight from Parquet: its own virtualenv.

``python -m bench.petastorm_peer --setup`` builds (or checks)
``bench/.peers/petastorm-venv`` (git-ignored): ``petastorm`` 0.13.1 with
pyspark (a dependency; no Spark session is started) and TensorFlow, from
``bench/petastorm_requirements.txt`` pinned by ``bench/petastorm_constraints.txt``.
Petastorm 0.13 imports ``pyarrow.filesystem`` and the legacy ``ParquetDataset``,
both gone from pyarrow 15, so this venv pins pyarrow 14.0.2 and with it numpy
1.26, pandas 2.2 and ml_dtypes 0.5 (TensorFlow 2.21 accepts them). Its feeding row
runs :mod:`bench.petastorm_worker` with that interpreter; the table beside
recordprep is :mod:`bench.parquet_peers`.
"""

from __future__ import annotations

from bench.peers import HERE, PeerVenv, setup_main

VENV = PeerVenv(name="petastorm-venv", label="Petastorm", requirements=HERE / "petastorm_requirements.txt",
                constraints=HERE / "petastorm_constraints.txt",
                dists=("petastorm", "pyarrow", "pyspark", "tensorflow-cpu"))


def main() -> None:
    setup_main(VENV, "bench.petastorm_peer")


if __name__ == "__main__":
    main()
