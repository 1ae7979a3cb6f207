"""``python -m pipelines.cli``: the ``recordprep`` command."""

from pipelines.cli import main

main()
