"""Who the node agent is: job id, node name and placement labels, from the environment.

The agent runs under a scheduler that already knows the answers; this module reads them from
the environment variables each scheduler sets, lets explicit configuration win, and fails with a
message that lists every variable it tried when the job cannot be found.

Variables read (highest priority first; explicit ``overrides`` beat all of them):

job
    ``MINDER_JOB`` (set it in a Kubernetes manifest from the downward API, e.g.
    ``fieldRef: metadata.labels['job-name']``), then Slurm's ``SLURM_JOB_ID``.
node
    ``MINDER_NODE``, Slurm's ``SLURMD_NODENAME``, the Kubernetes downward-API conventions
    ``NODE_NAME`` and ``MY_NODE_NAME`` (``fieldRef: spec.nodeName``), and finally
    :func:`socket.gethostname`.
labels
    ``MINDER_LABEL_<KEY>=<value>`` gives label ``<key>`` (lower-cased), e.g.
    ``MINDER_LABEL_GROUP=pp3`` and ``MINDER_LABEL_DOMAIN=leaf-12`` (docs/architecture.md §3.2:
    ``group`` is the peer group, ``domain`` the shared failure domain). Derived labels, which these
    override: ``switch`` = the leaf switch of Slurm's ``SLURM_TOPOLOGY_ADDR`` (read with
    ``SLURM_TOPOLOGY_ADDR_PATTERN``), ``pod`` from ``POD_NAME``/``MY_POD_NAME`` and ``namespace``
    from ``POD_NAMESPACE``/``MY_POD_NAMESPACE`` (downward API ``metadata.name``/``namespace``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from typing import NamedTuple

from minder.core.errors import ValidationError

JOB_VARIABLES = ("MINDER_JOB", "SLURM_JOB_ID")
"""Environment variables that name the job, in priority order."""
NODE_VARIABLES = ("MINDER_NODE", "SLURMD_NODENAME", "NODE_NAME", "MY_NODE_NAME")
"""Environment variables that name the node, in priority order (then the host name)."""
LABEL_PREFIX = "MINDER_LABEL_"
"""``MINDER_LABEL_<KEY>=<value>`` sets label ``<key>`` (lower-cased)."""
POD_VARIABLES = ("POD_NAME", "MY_POD_NAME")
NAMESPACE_VARIABLES = ("POD_NAMESPACE", "MY_POD_NAMESPACE")

# Labels become Prometheus label names on the agent's /metrics and keys on the wire: keep them to
# Prometheus' label-name alphabet (and lower case, so MINDER_LABEL_GROUP and --label group agree).
_LABEL_KEY = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MAX_VALUE = 256
_RESERVED = frozenset(
    {"job", "node", "device", "source", "reason", "instance", "job_id", "machine"}
)


class Identity(NamedTuple):
    """The agent's job id, node name and labels."""

    job: str
    node: str
    labels: dict[str, str]


def discover_identity(
    environ: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    *,
    hostname: Callable[[], str] = socket.gethostname,
) -> Identity:
    """Find the agent's job, node and labels.

    Parameters
    ----------
    environ
        The environment (``os.environ``), see the module documentation for the variables read.
    overrides
        Explicit configuration: keys ``job`` and ``node`` set those, every other key sets a label.
        Empty values are ignored (an unset option).
    hostname
        Last resort for the node name.

    Raises
    ------
    ValidationError
        No job id anywhere (the message lists the variables tried), no node name, or a label key
        or value that cannot be used.
    """
    explicit = {k: v for k, v in (overrides or {}).items() if v != ""}
    job = explicit.pop("job", None) or _first(environ, JOB_VARIABLES)
    if not job:
        raise ValidationError(
            "no job id: give --job (or the job override), or set one of the environment "
            f"variables {', '.join(JOB_VARIABLES)}"
        )
    node = explicit.pop("node", None) or _first(environ, NODE_VARIABLES) or hostname().strip()
    if not node:
        raise ValidationError(
            "no node name: give --node, or set one of the environment variables "
            f"{', '.join(NODE_VARIABLES)} (the host name was empty too)"
        )
    labels = _derived_labels(environ)
    for name, value in environ.items():
        if name.startswith(LABEL_PREFIX) and len(name) > len(LABEL_PREFIX) and value:
            labels[name[len(LABEL_PREFIX) :].lower()] = value
    labels.update(explicit)
    for key, value in labels.items():
        check_label(key, value)
    return Identity(_checked_name("job", job), _checked_name("node", node), labels)


def check_label(key: str, value: str) -> None:
    """Refuse a label key outside ``[a-z_][a-z0-9_]*`` (or reserved) and an unusable value."""
    if not _LABEL_KEY.fullmatch(key):
        raise ValidationError(
            f"label key {key!r} is not usable: expected lower-case letters, digits and '_', "
            "starting with a letter or '_' (at most 63 characters)"
        )
    if key in _RESERVED:
        raise ValidationError(
            f"label key {key!r} is reserved: the agent sets it itself; choose another key"
        )
    if not value or len(value) > _MAX_VALUE or not value.isprintable():
        raise ValidationError(
            f"label {key}={value!r}: expected a non-empty printable value of at most "
            f"{_MAX_VALUE} characters"
        )


def parse_label(text: str) -> tuple[str, str]:
    """Split one ``KEY=VALUE`` (the CLI's ``--label``); the key is lower-cased and checked."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValidationError(f"label {text!r} has no '=': expected KEY=VALUE, e.g. group=pp3")
    key = key.strip().lower()
    value = value.strip()
    check_label(key, value)
    return key, value


def slurm_leaf_switch(address: str, pattern: str | None = None) -> str | None:
    """The leaf switch in ``SLURM_TOPOLOGY_ADDR`` (``spine.leaf.node``), or None.

    ``pattern`` is ``SLURM_TOPOLOGY_ADDR_PATTERN`` (``switch.switch.node``); without it the last
    component is taken as the node and the one before it as its switch.
    """
    parts = [p for p in address.split(".") if p]
    if pattern:
        kinds = pattern.split(".")
        if len(kinds) != len(parts):
            return None
        switches = [p for p, kind in zip(parts, kinds, strict=True) if kind == "switch"]
        return switches[-1] if switches else None
    return parts[-2] if len(parts) >= 2 else None


def _derived_labels(environ: Mapping[str, str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    address = environ.get("SLURM_TOPOLOGY_ADDR", "")
    if address:
        switch = slurm_leaf_switch(address, environ.get("SLURM_TOPOLOGY_ADDR_PATTERN"))
        if switch:
            labels["switch"] = switch
    pod = _first(environ, POD_VARIABLES)
    if pod:
        labels["pod"] = pod
    namespace = _first(environ, NAMESPACE_VARIABLES)
    if namespace:
        labels["namespace"] = namespace
    return labels


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def _checked_name(what: str, value: str) -> str:
    value = value.strip()
    if not value or len(value) > _MAX_VALUE or not value.isprintable():
        raise ValidationError(
            f"{what} {value!r}: expected a non-empty printable name of at most {_MAX_VALUE} "
            "characters"
        )
    return value
