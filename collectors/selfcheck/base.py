"""What every check of ``minder selfcheck run`` shares (docs/selfcheck.md, "Checks").

A check looks at one part of a node that Minder took out of scheduling (its GPUs, RDMA ports,
clock, disks …) and answers with one :class:`~minder.core.selfcheck.CheckResult`. A check whose
hardware or tool is absent here says why in :meth:`Check.unavailable`: the runner then records it
``skipped`` with that reason, never as a failure.

This module holds the parts the checks and the runner share:

* :class:`CheckOptions` — every threshold and knob, with its documented default, in one place;
  each can be set from the environment as ``MINDER_SELFCHECK_<FIELD>``;
* :class:`CheckContext` — what a check is given (environment, options, baselines, where sysfs
  and ``/dev`` are, its time allowance);
* :class:`Check` — the interface;
* :data:`CHECKS` — the registry of the default checks, by name, in the order they run; each is
  imported only when it runs (:func:`collectors.selfcheck.runner.load_check`), so a node without
  torch can still run the others;
* the environment variables of the scheduler's launch (the shared contract of issue 24).

Only :mod:`minder.core` of ours is imported here (the collectors' rule).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from minder.core.errors import ValidationError
from minder.core.selfcheck import MAX_NAME, MAX_TEXT, CheckResult, CheckStatus, Measurement

# -- the launch's environment (shared contract of issue 24) ------------------------------------

ENV_PREFIX = "MINDER_SELFCHECK_"
"""Prefix of every variable of a self-check run (the launch's and :class:`CheckOptions`')."""
NODES_ENV = "MINDER_SELFCHECK_NODES"
"""Comma-separated scheduler node names of the check, suspect first."""
SUSPECT_ENV = "MINDER_SELFCHECK_SUSPECT"
"""The suspect node's name."""
NODE_ENV = "MINDER_SELFCHECK_NODE"
"""This node's name (else ``SLURMD_NODENAME``, else the host name)."""
RANK_ENV = "MINDER_SELFCHECK_RANK"
WORLD_ENV = "MINDER_SELFCHECK_WORLD"
MASTER_ENV = "MINDER_SELFCHECK_MASTER"
CHECK_ID_ENV = "MINDER_SELFCHECK_CHECK_ID"
REPORT_URL_ENV = "MINDER_SELFCHECK_REPORT_URL"
TOKEN_ENV = "MINDER_SELFCHECK_TOKEN"
"""The check's one-time secret: read by the CLI only, never logged, never an option."""
TIMEOUT_ENV = "MINDER_SELFCHECK_TIMEOUT_S"
"""Wall time the whole check may take (seconds)."""
BASELINE_ENV_PREFIX = "MINDER_SELFCHECK_BASELINE_"
"""``MINDER_SELFCHECK_BASELINE_<MODEL>=<TFLOP/s>``: a matmul baseline for a device model."""
SLURM_NODE_ENV = "SLURMD_NODENAME"

LAUNCH_VARIABLES = frozenset(
    {
        NODES_ENV,
        SUSPECT_ENV,
        NODE_ENV,
        RANK_ENV,
        WORLD_ENV,
        MASTER_ENV,
        CHECK_ID_ENV,
        REPORT_URL_ENV,
        TOKEN_ENV,
        TIMEOUT_ENV,
    }
)
"""The launch's variables: never read as :class:`CheckOptions`."""

# -- the registry ----------------------------------------------------------------------------

CHECKS: Mapping[str, tuple[str, str]] = {
    # First, so that the suspect and its partners meet at the rendezvous together (partners run
    # nothing else); the suspect's own checks follow.
    "collective.allreduce": ("collectors.selfcheck.runner", "CollectiveCheck"),
    "gpu.matmul": ("collectors.selfcheck.gpu", "MatmulCheck"),
    "gpu.nvml": ("collectors.selfcheck.gpu", "NvmlCheck"),
    "gpu.dcgm": ("collectors.selfcheck.gpu", "DcgmCheck"),
    "network.rdma": ("collectors.selfcheck.network", "RdmaCheck"),
    "network.ib_write_bw": ("collectors.selfcheck.network", "IbWriteBwCheck"),
    "host.clock": ("collectors.selfcheck.host", "ClockCheck"),
    "host.disk": ("collectors.selfcheck.host", "DiskCheck"),
    "host.memory_ecc": ("collectors.selfcheck.host", "MemoryEccCheck"),
}
"""The default checks: name -> (module, class), in the order they run."""
CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)
PARTNER_CHECKS: tuple[str, ...] = ("collective.allreduce",)
"""What a partner node runs: it lends its GPUs and network to the suspect's collective only."""

GIB = 1 << 30


# -- options ---------------------------------------------------------------------------------


def _option(
    default: Any, help_text: str, low: float | None = None, high: float | None = None
) -> Any:
    return field(default=default, metadata={"help": help_text, "low": low, "high": high})


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """Every threshold and knob of the checks, with its default: the one place they are set.

    Each field can be set from the environment as ``MINDER_SELFCHECK_<FIELD>`` (upper case;
    tuples comma-separated), e.g. ``MINDER_SELFCHECK_MATMUL_MIN_FRACTION=0.6``. docs/selfcheck.md
    ("Checks") says why each default is what it is.
    """

    matmul_min_fraction: float = _option(
        0.7, "gpu.matmul fails below this fraction of its device model's baseline", 0.0, 1.0
    )
    matmul_size_gpu: int = _option(8192, "gpu.matmul: square matrix size on a GPU (bf16)", 64)
    matmul_size_cpu: int = _option(1024, "gpu.matmul: square matrix size on the CPU (fp32)", 16)
    matmul_warmup: int = _option(3, "gpu.matmul: untimed multiplications first", 0)
    matmul_repeats: int = _option(10, "gpu.matmul: timed multiplications (median taken)", 1)
    xid_lookback_s: float = _option(
        3600.0, "gpu.nvml: XIDs of the kernel log this far back are recorded", 0.0
    )
    nvlink_expected: int = _option(
        0, "gpu.nvml: active NVLinks each GPU must have (0: as many as its best peer)", 0
    )
    pcie_width_expected: int = _option(
        0, "gpu.nvml: PCIe lanes each GPU must have (0: as many as its widest peer)", 0
    )
    pcie_gen_expected: int = _option(
        0, "gpu.nvml: PCIe generation each GPU in P0 must run at (0: as its best peer in P0)", 0
    )
    dcgm_timeout_s: float = _option(300.0, "gpu.dcgm: wall time of dcgmi diag -r 1", 1.0)
    rdma_interval_s: float = _option(
        1.0, "network.rdma: seconds between the two readings of the error counters", 0.0
    )
    rdma_ignore_ports: tuple[str, ...] = _option(
        (), "network.rdma: ports not judged, as <dev> or <dev>:<port> (unused ports)"
    )
    ib_write_bw_min_fraction: float = _option(
        0.75, "network.ib_write_bw fails below this fraction of the port's rate", 0.0, 1.0
    )
    ib_write_bw_min_gbps: float = _option(
        0.0, "network.ib_write_bw: an absolute minimum in Gb/s instead (0: the fraction)", 0.0
    )
    ib_write_bw_timeout_s: float = _option(
        60.0, "network.ib_write_bw: wall time of one loopback run", 1.0
    )
    collective_threshold: float = _option(
        2.0,
        "collective.allreduce fails a node slower than this many times its partners' median "
        "in both rounds",
        1.2,
    )
    clock_max_offset_s: float = _option(
        0.1, "host.clock fails when the clock is off by more than this (s)", 0.0
    )
    disk_min_free_fraction: float = _option(
        0.05, "host.disk fails below this fraction of a file system free", 0.0, 1.0
    )
    disk_min_free_bytes: int = _option(GIB, "host.disk fails below this many bytes free", 0)
    disk_paths: tuple[str, ...] = _option(
        (), "host.disk: paths checked besides / and /tmp (e.g. a scratch file system)"
    )
    check_timeout_s: float = _option(
        300.0, "time allowance of one check (gpu.dcgm and network.ib_write_bw add theirs)", 1.0
    )

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            low, high = spec.metadata.get("low"), spec.metadata.get("high")
            if isinstance(value, tuple):
                if not all(isinstance(item, str) and item for item in value):
                    raise ValidationError(
                        f"{env_name(spec.name)}={value!r}: expected non-empty texts"
                    )
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError(f"{env_name(spec.name)}={value!r}: expected a number")
            if not math.isfinite(value) or (low is not None and value < low):
                raise ValidationError(f"{env_name(spec.name)}={value!r}: expected >= {low}")
            if high is not None and value > high:
                raise ValidationError(f"{env_name(spec.name)}={value!r}: expected <= {high}")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CheckOptions:
        """The defaults, with every ``MINDER_SELFCHECK_<FIELD>`` of ``environ`` over them.

        Raises
        ------
        ValidationError
            A value is not a number (or list) in its bounds; the message names the variable.
        """
        changes: dict[str, Any] = {}
        for spec in fields(cls):
            name = env_name(spec.name)
            raw = environ.get(name)
            if raw is None:
                continue
            text = raw.strip()
            shown = one_line(raw, 40)
            if isinstance(spec.default, tuple):
                changes[spec.name] = tuple(p.strip() for p in text.split(",") if p.strip())
            elif isinstance(spec.default, int):
                try:
                    changes[spec.name] = int(text)
                except ValueError:
                    raise ValidationError(f"{name}={shown!r}: expected a whole number") from None
            else:
                try:
                    changes[spec.name] = float(text)
                except ValueError:
                    raise ValidationError(f"{name}={shown!r}: expected a number") from None
        return replace(cls(), **changes) if changes else cls()

    @classmethod
    def documented(cls) -> list[tuple[str, Any, str]]:
        """``(variable, default, help)`` of every option, for the docs and ``--help``."""
        return [(env_name(f.name), f.default, str(f.metadata["help"])) for f in fields(cls)]


def env_name(option: str) -> str:
    """The variable that sets :class:`CheckOptions` field ``option``."""
    return ENV_PREFIX + option.upper()


# -- context and interface -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckContext:
    """What a check is given.

    Attributes
    ----------
    environ
        The process environment (the launch's variables, ``PATH`` for the tools).
    options
        Thresholds and knobs.
    baselines
        Matmul baselines given for this run (model -> TFLOP/s, from ``--baseline-file`` and
        ``MINDER_SELFCHECK_BASELINE_*``), over the built-in ones.
    sysfs_root, dev_root, kmsg_path
        Where sysfs, ``/dev`` and the kernel log are (a fake tree in tests).
    timeout_s
        This check's time allowance; the runner sets it per check (the check's own, cut to what
        is left of the whole run's). Tools run by a check get a little less, so that the check
        answers with their timeout rather than being abandoned.
    """

    environ: Mapping[str, str] = field(default_factory=dict)
    options: CheckOptions = field(default_factory=CheckOptions)
    baselines: Mapping[str, float] = field(default_factory=dict)
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    kmsg_path: Path = Path("/dev/kmsg")
    timeout_s: float = 300.0

    def which(self, tool: str) -> str | None:
        """``tool``'s path on this run's ``PATH``, or None."""
        return shutil.which(tool, path=self.environ.get("PATH", os.defpath))

    def tool_timeout(self, own: float) -> float:
        """Seconds a tool may run: its own limit, within this check's allowance (95 %)."""
        return max(0.1, min(own, self.timeout_s * 0.95))


class Check(ABC):
    """One check of a node.

    Subclasses set :attr:`name` and implement :meth:`run`; :meth:`unavailable` says why the check
    cannot run here (its hardware or tool is absent), :meth:`timeout_s` how long it may take.
    A check raises only for what it did not foresee: the runner turns that into an ``error``
    result with a one-line summary.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    """One line: what it measures (``minder selfcheck run --help``, docs)."""

    def unavailable(self, context: CheckContext) -> str | None:
        """Why this check cannot run here (None: it can)."""
        return None

    def timeout_s(self, options: CheckOptions) -> float:
        """The check's own time allowance."""
        return options.check_timeout_s

    @abstractmethod
    def run(self, context: CheckContext) -> CheckResult:
        """Measure and judge; the result's ``name`` is :attr:`name`."""


# -- helpers the checks share ----------------------------------------------------------------


def result(
    name: str,
    status: CheckStatus,
    summary: str,
    measurements: Mapping[str, Measurement] | None = None,
) -> CheckResult:
    """A :class:`CheckResult` with a one-line summary (the runner sets ``duration_s``)."""
    return CheckResult(name, status, one_line(summary, MAX_TEXT), dict(measurements or {}))


def skipped(
    name: str, reason: str, measurements: Mapping[str, Measurement] | None = None
) -> CheckResult:
    """A ``skipped`` result saying why."""
    return result(name, CheckStatus.SKIPPED, reason, measurements)


def one_line(text: object, limit: int = MAX_TEXT) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


_KEY_BAD = re.compile(r"[^A-Za-z0-9_.:/\-\[\]]+")


def key(*parts: object) -> str:
    """A measurement name from ``parts`` joined by ``.``: characters a name may not hold become
    ``_`` and it is cut to 64 characters (the report's rule)."""
    text = _KEY_BAD.sub("_", ".".join(str(p) for p in parts)).strip("_") or "_"
    return text[:MAX_NAME]


def node_name(environ: Mapping[str, str]) -> str:
    """This node's scheduler name: ``MINDER_SELFCHECK_NODE``, ``SLURMD_NODENAME`` or the host
    name."""
    for variable in (NODE_ENV, SLURM_NODE_ENV):
        value = environ.get(variable, "").strip()
        if value:
            return value
    return socket.gethostname()


def run_tool(argv: Sequence[str], timeout_s: float, environ: Mapping[str, str]) -> ToolRun:
    """Run a tool to completion, capturing its output as text.

    Never raises for the tool's own failure: a timeout or a failure to start is in the answer.
    """
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
            env=dict(environ),
        )
    except subprocess.TimeoutExpired as exc:
        return ToolRun(None, _text(exc.stdout), _text(exc.stderr), timed_out=True)
    except OSError as exc:
        return ToolRun(None, "", f"cannot run {argv[0]}: {exc.strerror or exc}")
    return ToolRun(done.returncode, done.stdout, done.stderr)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What a tool run by a check answered."""

    returncode: int | None
    """None when it timed out or could not start."""
    stdout: str
    stderr: str
    timed_out: bool = False

    def why(self, limit: int = 160) -> str:
        """One line on how it ended: its first line of error output, or its exit status."""
        if self.timed_out:
            return "timed out"
        text = self.stderr.strip() or self.stdout.strip()
        first = text.splitlines()[0] if text else ""
        status = f"exit status {self.returncode}" if self.returncode is not None else "not run"
        return one_line(f"{status}: {first}" if first else status, limit)
