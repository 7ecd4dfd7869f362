"""``python -m minder.cli``: the same as the ``minder`` command."""

from minder.cli.app import main

main()
