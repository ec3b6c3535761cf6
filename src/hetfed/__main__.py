"""``python -m hetfed``: the ``hetfed`` command, for an environment whose scripts are not on PATH."""

from hetfed.cli import entry

if __name__ == "__main__":
    entry()
