"""The node side of self-checks (issue 24): the checks ``minder selfcheck run`` runs on a node
that Minder took out of scheduling, and their runner (docs/selfcheck.md).

:mod:`~collectors.selfcheck.base` holds the interface, the options and the registry;
:mod:`~collectors.selfcheck.gpu`, :mod:`~collectors.selfcheck.network` and
:mod:`~collectors.selfcheck.host` the checks; :mod:`~collectors.selfcheck.runner` runs them.
Nothing heavy is imported with the package: torch and pynvml only when their check runs.
"""
