"""Ray Data, the peer a team with Parquet data might pick instead: its own virtualenv.

``python -m bench.ray_data --setup`` builds (or checks) ``bench/.peers/ray-venv``
(git-ignored): ``ray[data]`` 2.x with the TensorFlow its ``iter_tf_batches`` and
``write_tfrecords`` need, from ``bench/ray_requirements.txt`` pinned by
``bench/ray_constraints.txt``, re-created only when those files change. Its rows
(conversion, feeding) run :mod:`bench.ray_worker` with that interpreter; the
table beside recordprep is :mod:`bench.parquet_peers`.
"""

from __future__ import annotations

from bench.peers import HERE, PeerVenv, setup_main

VENV = PeerVenv(name="ray-venv", label="Ray Data", requirements=HERE / "ray_requirements.txt",
                constraints=HERE / "ray_constraints.txt", dists=("ray", "pyarrow", "pandas", "tensorflow-cpu"))


def main() -> None:
    setup_main(VENV, "bench.ray_data")


if __name__ == "__main__":
    main()
