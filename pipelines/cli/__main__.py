"""``python -m pipelines.cli``: the ``recordprep`` command."""

from pipelines.cli import main

if __name__ == "__main__":  # imported, as by a walk over every module, it runs nothing
    main()
