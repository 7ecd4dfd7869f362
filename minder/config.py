"""Settings of the service and CLI (pydantic-settings, prefix ``MINDER_``, nested with ``__``).

Only entry points (the CLI, the API app factory) build :class:`Settings`; libraries take plain
arguments. Example: ``MINDER_KAFKA__BOOTSTRAP=broker:9092 MINDER_DATABASE__URL=postgresql+psycopg://…``.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, get_args, get_origin

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as PydanticSettingsError

from detectors.config import OWN_PAUSE_FACTORS, DetectorConfig, own_pause_factor_ok
from minder.core.errors import ValidationError
from minder.core.records import ALERTS_TOPIC, DEADLETTER_TOPIC, METRICS_TOPIC

if TYPE_CHECKING:  # detectors.base loads numpy: not for the node agent, which reads settings too
    from detectors.base import DetectorFactory
    from minder.service.engine import ServiceLimits

ENV_PREFIX = "MINDER_"
ENV_DELIMITER = "__"


class SettingsError(ValidationError):
    """A ``MINDER_*`` variable holds a value that is not allowed."""


DISTRIBUTION = "minder"
"""The distribution whose extras :func:`install_hint` names."""

OTHER_VARIABLES: dict[str, str] = {
    # name -> who reads it; none is a setting, all are documented (a typo of a setting is not)
    "MINDER_JOB": "minder agent: the job id (deploy/systemd/minder-agent.env)",
    "MINDER_NODE": "minder agent: the node name",
    "MINDER_KAFKA": "minder agent unit: its --kafka (deploy/systemd/minder-agent.service)",
    "MINDER_METRICS_ADDR": "minder agent unit: its --metrics-addr",
    "MINDER_METRICS_PORT": "minder agent unit: its --metrics-port",
    "MINDER_AGENT_ARGS": "minder agent unit: further options",
    "MINDER_AGENT_SIGNING_KEY": "minder agent: the node's signing key",
    "MINDER_AGENT_FR_PREFIX": "minder agent: --fr-prefix (flight-recorder dumps)",
    "MINDER_PROBE_ADDR": "training processes: where the agent's step probe listens",
    "MINDER_API_URL": "minder alerts|actions|breaker: the API's address",
    "MINDER_API_TOKEN": "minder alerts|actions|breaker: the API token (and the compose trial)",
    "MINDER_EMBEDDED_BROKER_PARENT": "the embedded broker: the Minder process that started it",
    "MINDER_TEST_POSTGRES_URL": "the tests: their PostgreSQL server",
    "MINDER_FAULT_FIGURES": "the fault tests: where their figures go",
    "MINDER_WEBHOOK_SECRET": "docs/examples/webhook_receiver.py: the endpoint's secret",
}
"""``MINDER_*`` variables Minder documents that are not settings: never refused as unknown, and
never read as settings (``MINDER_KAFKA`` would otherwise be parsed as the whole ``kafka``
section)."""
OTHER_PREFIXES: tuple[str, ...] = ("MINDER_LABEL_",)
"""Families of such variables: ``MINDER_LABEL_<KEY>`` are the agent's placement labels."""
SELFCHECK_NODE_PREFIX = "MINDER_SELFCHECK_"
"""``minder selfcheck run``'s variables on a checked node, ``MINDER_SELFCHECK_<NAME>`` with one
underscore (the rendezvous, the check's options such as ``MINDER_SELFCHECK_MATMUL_MIN_FRACTION``,
``MINDER_SELFCHECK_BASELINE_<MODEL>``): not settings, never refused. The service's settings are
``MINDER_SELFCHECK__<NAME>``, with two."""


def is_other_variable(name: str) -> bool:
    """Whether ``name`` is a ``MINDER_*`` variable Minder documents that is not a setting
    (:data:`OTHER_VARIABLES`, :data:`OTHER_PREFIXES`, ``minder selfcheck run``'s)."""
    upper = name.upper()
    if upper in OTHER_VARIABLES or upper.startswith(OTHER_PREFIXES):
        return True
    return upper.startswith(SELFCHECK_NODE_PREFIX) and not upper.startswith(
        SELFCHECK_NODE_PREFIX + "_"
    )


KUBERNETES_SERVICE_LINK = re.compile(
    r"^MINDER(_[A-Z0-9]+)*_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?"
    r"|PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$"
)
"""What Kubernetes sets in every pod of a namespace for a Service named ``minder`` or
``minder-*`` (service links: ``MINDER_SERVICE_HOST``, ``MINDER_PORT_8080_TCP_ADDR``, ...). They
are no settings and not Minder's to refuse."""


def missing_modules(*modules: str) -> list[str]:
    """The top-level modules of ``modules`` that cannot be imported here (none is imported)."""
    missing = []
    for module in modules:
        if module in sys.modules:
            if sys.modules[module] is None:  # blocked, as ``import`` would fail
                missing.append(module)
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def install_hint(package: str) -> str:
    """How to install ``package`` for Minder: ``pip install 'minder[kubernetes]'`` when an
    extra of the installed distribution carries it, else ``pip install 'package'``."""
    import importlib.metadata  # noqa: PLC0415  (only when something is missing)

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    extras = []
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if name is None or canonical(name.group()) != canonical(package):
            continue
        if extra is None:  # a dependency of Minder itself, missing from this environment
            return f"pip install '{package}' (a dependency of {DISTRIBUTION})"
        extras.append(extra.group(1))
    chosen = [e for e in extras if e != "dev"] or extras
    if chosen:
        return f"pip install '{DISTRIBUTION}[{chosen[0]}]'"
    return f"pip install '{package}'"


def _needs_packages(what: str, modules: dict[str, str], instead: str) -> None:
    """Raise the one-line error of ``what`` when a module of ``modules`` (module -> package)
    is missing: the packages, how to install them, and ``instead`` (what needs none)."""
    missing = missing_modules(*modules)
    if not missing:
        return
    packages = list(dict.fromkeys(modules[module] for module in missing))
    names = " and ".join(repr(p) for p in packages)
    raise ValueError(
        f"{what} needs the Python package{'s' if len(packages) > 1 else ''} {names}, not "
        f"installed: {install_hint(packages[0])}, or {instead}"
    )


class KafkaSettings(BaseModel):
    """Where the metrics come from and alerts go, and how the clients reach the brokers.

    The security settings (``security_protocol``, ``ssl_*``, ``sasl_*``) apply to every Kafka
    client of Minder alike: :meth:`client_options` turns them into kafka-python's keyword
    arguments. They are checked together: SASL needs a mechanism, a user name and a password, TLS
    files must exist and load, and neither may be given to a protocol that would ignore them.
    """

    TLS_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"SSL", "SASL_SSL"})
    SASL_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})

    bootstrap: str = Field("127.0.0.1:9092", description="host:port[,host:port…] of the brokers")
    metrics_topic: str = METRICS_TOPIC
    alerts_topic: str = ALERTS_TOPIC
    deadletter_topic: str = DEADLETTER_TOPIC
    group_id: str = "minder-detect"
    partitions: int = Field(4, ge=1, description="partitions when Minder creates its topics")
    client_id: str = "minder"
    # kafka-python waits max_poll_interval_ms for slow members when a group rebalances; the
    # default (5 min) makes every restart stall, so keep it short.
    max_poll_interval_ms: int = Field(10_000, ge=1_000)
    # Tansu holds a group join for about half the session timeout: 6 s keeps joins near 3 s.
    session_timeout_ms: int = Field(6_000, ge=1_000)
    heartbeat_interval_ms: int = Field(1_000, ge=100)
    # One poll is one detection pass and one offset commit: larger polls amortise both
    # (bench/ingest_e2e.py; figures in bench/RESULTS.md "Ingest end to end").
    max_poll_records: int = Field(5000, ge=1, description="most batches one poll hands over")
    max_partition_fetch_bytes: int = Field(
        8 << 20, ge=1024, description="most bytes one fetch brings back per partition"
    )
    fetch_max_bytes: int = Field(50 << 20, ge=1024, description="most bytes one fetch brings back")
    publish_alerts: bool | None = Field(
        None,
        description="publish alerts on the alerts topic; none = when Kafka is a metrics source "
        "(a Prometheus-only service then needs no broker)",
    )
    # The order matters: each check below sees the fields declared before it (info.data).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="TLS (SSL), SASL, both (SASL_SSL) or neither (PLAINTEXT)"
    )
    ssl_cafile: Path | None = Field(
        None, description="PEM file of the CAs of the brokers' certificates; none = system CAs"
    )
    ssl_keyfile: Path | None = Field(
        None, description="PEM private key of ssl_certfile, when it is not in that file"
    )
    ssl_password: SecretStr | None = Field(None, description="password of an encrypted key")
    ssl_certfile: Path | None = Field(
        None, validate_default=True, description="PEM client certificate (mutual TLS)"
    )
    ssl_check_hostname: bool = Field(
        True, description="check that a broker's certificate names the host connected to"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, validate_default=True, description="SASL mechanism (SASL_* protocols only)"
    )
    sasl_username: str | None = Field(None, validate_default=True, description="SASL user name")
    sasl_password: SecretStr | None = Field(
        None, validate_default=True, description="SASL password"
    )

    @field_validator(
        "security_protocol",
        "ssl_cafile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_certfile",
        "sasl_mechanism",
        "sasl_username",
        "sasl_password",
        mode="before",
    )
    @classmethod
    def _normalise(cls, value: object, info: ValidationInfo) -> object:
        """Empty means unset (a blank variable of a template); protocols and mechanisms are
        case-insensitive, ``SCRAM_SHA_256`` is ``SCRAM-SHA-256``."""
        if not isinstance(value, str):
            return value
        if info.field_name == "security_protocol":
            return value.strip().upper()
        if not value.strip():
            return None
        if info.field_name == "sasl_mechanism":
            return value.strip().upper().replace("_", "-")
        return value

    @field_validator("ssl_cafile", "ssl_keyfile", "ssl_password", "ssl_certfile")
    @classmethod
    def _check_tls(cls, value: Any, info: ValidationInfo) -> Any:
        protocol = info.data.get("security_protocol")
        if value is not None and protocol is not None and protocol not in cls.TLS_PROTOCOLS:
            raise ValueError(
                f"expected no TLS setting with security protocol {protocol}: set the protocol "
                "to SSL or SASL_SSL, or leave this unset"
            )
        if info.field_name == "ssl_certfile" and value is None:
            if info.data.get("ssl_keyfile") is not None or info.data.get("ssl_password"):
                raise ValueError(
                    "missing: expected the client certificate (PEM) since ssl_keyfile or "
                    "ssl_password is set"
                )
            return value
        if not isinstance(value, Path):
            return value
        if not value.is_file() or not os.access(value, os.R_OK):
            why = "is not a file" if value.exists() else "does not exist"
            raise ValueError(f"{why} or is not readable: expected a readable PEM file")
        import ssl  # noqa: PLC0415  (only when a TLS file is set)

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            if info.field_name == "ssl_cafile":
                context.load_verify_locations(cafile=value)
            elif info.field_name == "ssl_certfile":
                password = info.data.get("ssl_password")
                keyfile = info.data.get("ssl_keyfile")
                # A password, even empty: with none OpenSSL would prompt on the terminal.
                context.load_cert_chain(
                    value, keyfile, password.get_secret_value() if password else ""
                )
        except ssl.SSLError as exc:
            what = (
                "CA certificates"
                if info.field_name == "ssl_cafile"
                else "client certificate with its key (ssl_keyfile or this file), decrypted "
                "with ssl_password if the key is encrypted"
            )
            reason = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(exc.args[-1]))
            raise ValueError(f"cannot be loaded ({reason}): expected PEM {what}") from None
        return value

    @field_validator("sasl_mechanism", "sasl_username", "sasl_password")
    @classmethod
    def _check_sasl(cls, value: Any, info: ValidationInfo) -> Any:
        protocol = info.data.get("security_protocol")
        if protocol is None:  # the protocol itself is wrong: that error says enough
            return value
        if protocol not in cls.SASL_PROTOCOLS and value is not None:
            raise ValueError(
                f"expected no SASL setting with security protocol {protocol}: set the protocol "
                "to SASL_PLAINTEXT or SASL_SSL, or leave this unset"
            )
        if protocol in cls.SASL_PROTOCOLS and value is None:
            expected = {
                "sasl_mechanism": "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
                "sasl_username": "the SASL user name",
                "sasl_password": "the SASL password (from the environment or a password file)",
            }[str(info.field_name)]
            raise ValueError(f"missing: expected {expected} with security protocol {protocol}")
        return value

    def client_options(self) -> dict[str, Any]:
        """The security settings as kafka-python client keyword arguments (``security_protocol``,
        ``ssl_*``, ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``).

        Every client takes them: producers, consumers, admin clients. The result holds the
        passwords in clear: hand it to a client, never to a log.
        """
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol in self.TLS_PROTOCOLS:
            options.update(
                ssl_cafile=None if self.ssl_cafile is None else str(self.ssl_cafile),
                ssl_certfile=None if self.ssl_certfile is None else str(self.ssl_certfile),
                ssl_keyfile=None if self.ssl_keyfile is None else str(self.ssl_keyfile),
                ssl_password=(
                    None if self.ssl_password is None else self.ssl_password.get_secret_value()
                ),
                ssl_check_hostname=self.ssl_check_hostname,
            )
        if self.security_protocol in self.SASL_PROTOCOLS:
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=(
                    None if self.sasl_password is None else self.sasl_password.get_secret_value()
                ),
            )
        return options

    def describe_security(self) -> str:
        """How the clients connect, for a start-up line: no secret, e.g.
        ``SASL_SSL, SCRAM-SHA-512 as 'minder-svc', client certificate``."""
        parts: list[str] = [self.security_protocol]
        if self.security_protocol in self.SASL_PROTOCOLS:
            parts.append(f"{self.sasl_mechanism} as {self.sasl_username!r}")
        if self.security_protocol in self.TLS_PROTOCOLS:
            if self.ssl_certfile is not None:
                parts.append("client certificate")
            if not self.ssl_check_hostname:
                parts.append("hostname not checked")
        return ", ".join(parts)


class PrometheusSourceSettings(BaseModel):
    """Prometheus as a metrics source of ``minder serve`` (docs/sources.md §8): dcgm-exporter,
    node_exporter and agent series polled every step, instead of or beside Kafka."""

    url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="base URL, e.g. http://prometheus:9090; none = this source is off",
    )
    step_s: float = Field(
        15.0, ge=1, le=3600, description="sampling interval: set it to the scrape interval"
    )
    match: list[str] = Field(
        default_factory=list,
        description="PromQL label matchers added to every selector, e.g. '{cluster=\"a\"}'",
    )
    job_labels: list[str] = Field(
        # as collectors.prometheus.DEFAULT_JOB_LABELS (not imported: settings stay light)
        default_factory=lambda: ["slurm_job_id", "job_id", "SLURM_JOB_ID", "hpc_job"],
        description="labels naming the job, first present wins ('a+b' joins two)",
    )
    machine_labels: list[str] = Field(
        # as collectors.prometheus.DEFAULT_MACHINE_LABELS
        default_factory=lambda: ["machine", "Hostname", "hostname", "node", "instance"],
        description="labels naming the machine, first present wins ('instance' loses its port)",
    )
    default_job: str | None = Field(
        None, min_length=1, description="job of machines whose series carry no job label"
    )
    lag_s: float = Field(
        30.0, ge=0, description="read this far behind now, so that the scrapes have landed"
    )
    timeout_s: float = Field(10.0, gt=0, description="timeout of each HTTP request")
    rate_window_s: float | None = Field(
        None, gt=0, description="range of rate() for counters (default: twice the step)"
    )
    max_catchup_s: float = Field(
        900.0,
        gt=0,
        description="after failed polls, at most this much of the missed range is read again; "
        "older steps are skipped and counted",
    )
    bearer_token: str | None = Field(None, description="for a Prometheus behind authentication")


class DatabaseSettings(BaseModel):
    """Alert and job storage."""

    url: str = Field("sqlite:///minder.db", description="SQLAlchemy URL; PostgreSQL in production")
    echo: bool = False

    # dialect -> the drivers Minder runs on it (None: the dialect alone, SQLAlchemy's default)
    SUPPORTED: ClassVar[dict[str, tuple[str | None, ...]]] = {
        "sqlite": (None, "pysqlite"),
        "postgresql": (None, "psycopg"),
        "postgres": (None, "psycopg"),
    }
    EXPECTED: ClassVar[str] = (
        "expected sqlite:///PATH or postgresql://USER@HOST:PORT/DB (Minder stores its data in "
        "SQLite or PostgreSQL, through psycopg 3)"
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        """A dialect and driver Minder supports, with its driver installed (parsed here, not by
        SQLAlchemy: settings stay light)."""
        found = re.match(r"^([A-Za-z][A-Za-z0-9]*)(?:\+([A-Za-z0-9_]+))?://", value.strip())
        if found is None:
            raise ValueError(f"not a database URL: {cls.EXPECTED}")
        dialect, driver = found.group(1).lower(), found.group(2)
        drivers = cls.SUPPORTED.get(dialect)
        if drivers is None:
            raise ValueError(f"database {dialect!r} is not supported: {cls.EXPECTED}")
        if (driver.lower() if driver else None) not in drivers:
            raise ValueError(
                f"driver {driver!r} of {dialect} is not supported: expected "
                + " or ".join(f"{dialect}+{d}://" if d else f"{dialect}://" for d in drivers)
            )
        if dialect != "sqlite":
            _needs_packages(
                "a PostgreSQL URL", {"psycopg": "psycopg[binary]"}, "use sqlite:///PATH for a trial"
            )
        return value.strip()


class ApiSettings(BaseModel):
    """HTTP API (docs/operations.md, *API security*)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    token: str | None = Field(
        None,
        description="bearer token of the mutating endpoints and of every /api/v1 read; none = "
        "changes refused (403) unless open, reads only from loopback unless open_reads",
    )
    open: bool = Field(
        False,
        description="without a token, let anyone who reaches the port make changes and read (a "
        "trial on a trusted network only; a warning is logged at start)",
    )
    open_reads: bool = Field(
        False,
        description="without a token, serve the /api/v1 reads to any client, not only to "
        "loopback ones (changes stay refused)",
    )
    protect_reads: bool = Field(
        False,
        description="deprecated, no effect: with a token every /api/v1 read needs it",
    )
    allowed_hosts: list[str] | None = Field(
        None,
        description="Host header values accepted ('*.example.org' for subdomains, '*' any); "
        "none = localhost, 127.0.0.1 and [::1] when bound to a loopback address, any otherwise",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="browser origins (https://grafana.example.org) allowed cross-origin requests; "
        "none by default",
    )
    keep_alive_s: int = Field(5, ge=1, le=3600, description="idle keep-alive connections close")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="a connection whose request line and headers are not complete this long "
        "after it opened (or after the first byte of its next request) gets 408 and is closed",
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="connections held at once; past it a new one closes the one waiting "
        "longest for its request head, or gets 503; none = 3/4 of the open-file limit "
        "(ulimit -n), at most 4096",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="a request body that stalls this long gets 408 and its connection closed",
    )
    body_min_rate: int = Field(
        1024,
        ge=1,
        le=1 << 30,
        description="bytes per second a request body must average after its first "
        "body_timeout_s seconds (slower gets 408)",
    )
    external_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="how operators reach this API (links in Alertmanager and webhooks)",
    )

    def model_post_init(self, context: Any, /) -> None:
        """Refuse contradictory security settings (one line naming the variables)."""
        if self.token is not None and not self.token.strip():
            self.token = None  # MINDER_API__TOKEN= (empty) means no token
        if self.token is not None and self.open:
            raise ValueError(
                "open mode (MINDER_API__OPEN=true) and a token (MINDER_API__TOKEN) are both set: "
                "expected one of them (the token restricts changes to its holders, open mode "
                "lets anyone change)"
            )
        if self.token is not None and self.open_reads:
            raise ValueError(
                "open reads (MINDER_API__OPEN_READS=true) and a token (MINDER_API__TOKEN) are "
                "both set: expected one of them (with a token every read needs it, open reads "
                "serve them to anyone)"
            )
        if self.protect_reads and self.token is None:
            raise ValueError(
                "protected reads (MINDER_API__PROTECT_READS=true, deprecated) need a token: "
                "expected MINDER_API__TOKEN too, which protects reads by itself"
            )
        for pattern in self.allowed_hosts or ():
            if not self._valid_host_pattern(pattern):
                raise ValueError(
                    f"host {pattern!r} of MINDER_API__ALLOWED_HOSTS: expected a host name or "
                    "address, '*.example.org' or '*'"
                )

    def effective_allowed_hosts(self) -> list[str]:
        """The Host header values the API accepts: :attr:`allowed_hosts`, else the loopback
        names when bound to a loopback address (against DNS rebinding), else any (``["*"]``)."""
        if self.allowed_hosts is not None:
            return list(self.allowed_hosts)
        bound = self.host.strip("[]").lower()
        if bound in ("localhost", "::1") or bound.startswith("127."):
            return ["localhost", "127.0.0.1", "[::1]"]
        return ["*"]

    def describe_access(self) -> str:
        """How the API is guarded, for the start-up line (never the token itself)."""
        if self.open:
            return "API open to reads and changes by anyone (MINDER_API__OPEN=true)"
        if self.token is None:
            readers = "any client (MINDER_API__OPEN_READS=true)" if self.open_reads else "loopback"
            return f"API reads from {readers}, changes refused until MINDER_API__TOKEN is set"
        return "API changes and reads need the token"

    @staticmethod
    def _valid_host_pattern(pattern: str) -> bool:
        """``*``, ``*.example.org``, a host name, an IPv4 address or a bracketed IPv6 one."""
        if pattern == "*":
            return True
        name = pattern.removeprefix("*.")
        if name.startswith("[") and name.endswith("]") and pattern == name:
            return len(name) > 2
        return bool(name) and not any(c.isspace() or c in "*/:@[]" for c in name)


class DetectionSettings(BaseModel):
    """Detection loop parameters (see ``detectors.config.DetectorConfig``)."""

    window_s: int = Field(8, ge=2, le=600)
    threshold: float = Field(6.0, gt=0)
    continuity_s: int = Field(30, ge=1)
    silence_s: float = Field(10.0, gt=0)
    grace_s: float = Field(2.0, ge=0, description="how long to wait for late samples of a second")
    min_machines: int = Field(4, ge=2)
    method: str = Field("minder", description="detection method (detectors.methods.METHODS)")
    model_dir: Path | None = Field(None, description="trained model directory (minder train)")
    denoiser: str = Field("mean", description="filter of metrics without a trained denoiser")
    hang_own_pause_factor: float = Field(
        0.0,
        description="0: a hang is alerted within its bound whatever the job did before; 1-100: "
        "a stall with no rank stopped first is held up to this many times the longest one the "
        "job ended by itself (an unreported checkpoint), never past 60 s (docs/hangs.md)",
    )
    max_jobs: int = Field(
        1_000,
        ge=1,
        description="jobs per worker; a new job beyond it takes the place of one worth less "
        "(one-shot, fewer machines, unconfirmed by the scheduler) or is refused, counted",
    )
    admission_lookups_per_s: float = Field(
        20.0,
        gt=0,
        description="with a scheduler target: at most this many questions a second whether a "
        "job runs (asked in a thread of their own, never in the poll loop)",
    )
    admission_confirmed_ttl_s: float = Field(
        600.0, gt=0, description="a job the scheduler confirmed is asked again after this"
    )
    admission_not_found_ttl_s: float = Field(
        120.0, gt=0, description="a job the scheduler did not know is asked again after this"
    )
    job_retention_s: float = Field(
        3_600.0,
        ge=0,
        description="an idle job (no data for 15 minutes: its window dropped) is ended after "
        "this much longer without data (docs/operations.md, Job lifecycle)",
    )
    new_job_max_age_s: float = Field(
        86_400.0,
        ge=0,
        description="a batch older than this does not start a job (a replay of old data, a "
        "broken clock); 0 = no limit",
    )
    max_machines_per_job: int = Field(20_000, ge=1)
    max_series_per_machine: int = Field(4_096, ge=1)
    max_name_length: int = Field(256, ge=8, description="job, machine, metric, device names")
    max_pending_events: int = Field(10_000, ge=1)
    event_skew_s: float = Field(
        300.0, gt=0, description="an event farther than this from its batch's time is refused"
    )
    top_k_scores: int = Field(
        20, ge=1, description="machines per job exported in minder_machine_score"
    )
    machine_series_per_job: int = Field(
        4_096,
        ge=0,
        le=4_096,
        description="machines per job exported in minder_machine_score_all (every machine of a "
        "job up to this bound, the highest scores beyond it) and ranks per job in "
        "minder_rank_lateness_seconds (the latest beyond it); at most 4,096; 0 = only the "
        "top_k_scores highest",
    )

    def service_limits(self) -> ServiceLimits:
        """The bounds of one detection worker's state (``minder.service.engine``)."""
        from detectors.window import WindowLimits  # noqa: PLC0415
        from minder.service.engine import ServiceLimits  # noqa: PLC0415

        return ServiceLimits(
            max_jobs=self.max_jobs,
            new_job_max_age_s=self.new_job_max_age_s or math.inf,
            top_k_scores=self.top_k_scores,
            machine_series_per_job=self.machine_series_per_job,
            window=WindowLimits(
                max_machines=self.max_machines_per_job,
                max_series_per_machine=self.max_series_per_machine,
                max_name_length=self.max_name_length,
                max_pending_events=self.max_pending_events,
                event_skew_s=self.event_skew_s,
            ),
        )

    @field_validator("hang_own_pause_factor")
    @classmethod
    def _check_own_pause(cls, value: float) -> float:
        if not own_pause_factor_ok(value):
            raise ValueError(f"expected {OWN_PAUSE_FACTORS}")
        return value

    @field_validator("method", "denoiser")
    @classmethod
    def _check_name(cls, value: str, info: ValidationInfo) -> str:
        """A method of ``detectors.methods``, a denoiser of ``detectors.denoisers`` (imported
        only when set: the node agent reads these settings too); the LSTM-VAE needs torch."""
        if info.field_name == "method":
            from detectors.methods import METHODS as names  # noqa: PLC0415, N811
        else:
            from detectors.denoisers import DENOISER_KINDS as names  # noqa: PLC0415, N811
        if value not in names:
            raise ValueError(f"unknown {info.field_name}: expected one of {', '.join(names)}")
        if value == "lstm_vae":
            _needs_packages("the LSTM-VAE denoiser", {"torch": "torch"}, "choose mean or median")
        return value

    def detector_config(self) -> DetectorConfig:
        """These parameters as the detector takes them."""
        return DetectorConfig(
            window_s=self.window_s,
            threshold=self.threshold,
            continuity_s=self.continuity_s,
            silence_s=self.silence_s,
            min_machines=self.min_machines,
            denoiser=self.denoiser,
            hang_own_pause_factor=self.hang_own_pause_factor,
        )

    def detector_factory(
        self, method: str | None = None, model_dir: Path | None = None
    ) -> DetectorFactory:
        """Factory of per-job detectors: ``method`` and ``model_dir`` override the settings.

        Raises
        ------
        ModelError
            The model directory is missing, of another version, or damaged.
        """
        from detectors.methods import BASELINE_METHODS, method_factory  # noqa: PLC0415
        from detectors.model import load_model  # noqa: PLC0415

        chosen = method or self.method
        directory = model_dir if model_dir is not None else self.model_dir
        if chosen in BASELINE_METHODS and model_dir is None:
            directory = None  # a configured model belongs to the engine, not to the baselines
        model = load_model(directory) if directory is not None else None
        return method_factory(chosen, config=self.detector_config(), model=model)


class WhatIfSettings(BaseModel):
    """The what-if analysis endpoint (``POST /api/v1/whatif``)."""

    roots: list[Path] = Field(
        default_factory=list,
        description="directories whose traces the server may read by path; empty = uploads only",
    )
    workdir: Path | None = Field(None, description="where uploads are kept while analysed")
    max_upload_bytes: int = Field(512 * 2**20, ge=1)
    workers: int = Field(1, ge=1, le=4)


class WebhookEndpoint(BaseModel):
    """One webhook receiver, signed per the Standard Webhooks specification."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description="destination webhook:<name>"
    )
    url: str = Field(pattern=r"^https?://", description="where events are POSTed")
    secrets: list[str] = Field(
        default_factory=list,
        description="signing secrets 'whsec_<base64>', newest first; several while rotating",
    )
    events: list[str] = Field(
        default_factory=lambda: [
            "alert.opened",
            "alert.acknowledged",
            "alert.resolved",
            "alert.false_positive",
            "alert.confirmed",
            "alert.cleared_by_selfcheck",
            "selfcheck.inconclusive",
            "breaker.tripped",
            "breaker.reset",
        ],
        description="event types this endpoint receives",
    )


class WebhookSettings(BaseModel):
    """Signed webhooks (docs/webhooks.md)."""

    endpoints: list[WebhookEndpoint] = Field(default_factory=list)
    urls: list[str] = Field(
        default_factory=list,
        description="receivers without a secret (unsigned; prefer endpoints), named url1, url2…",
    )
    timeout_s: float = Field(5.0, gt=0, description="one attempt's connect/read/write timeout")

    def all_endpoints(self) -> list[WebhookEndpoint]:
        """``endpoints``, then ``urls`` as unsigned endpoints."""
        extra = [WebhookEndpoint(name=f"url{i + 1}", url=url) for i, url in enumerate(self.urls)]
        return [*self.endpoints, *extra]


class AlertmanagerSettings(BaseModel):
    """Alertmanager v2 (alerts pushed, re-sent while open, ended on resolve)."""

    url: str | None = Field(
        None, pattern=r"^https?://", description="e.g. http://alertmanager:9093"
    )
    refresh_s: float = Field(60.0, ge=5, description="how often open alerts are re-sent")
    timeout_s: float = Field(5.0, gt=0)
    bearer_token: str | None = None


class DeliverySettings(BaseModel):
    """The outbox: how long and how often deliveries are retried."""

    ttl_s: float = Field(24 * 3600.0, gt=0, description="a delivery is retried this long")
    backoff_base_s: float = Field(1.0, gt=0)
    backoff_cap_s: float = Field(60.0, gt=0, description="longest wait between two attempts")
    lease_s: float = Field(
        15.0,
        ge=1,
        description="a claimed event stays its worker's this long without a renewal (renewed "
        "every third of it while being sent): after a crash it is redelivered this long after",
    )
    retain_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="delivered and expired events are kept this long"
    )


class ActionSettings(BaseModel):
    """Scheduler actions (drain, cordon): log-only until ``enforce`` is true."""

    target: Literal["none", "slurm", "kubernetes"] = "none"
    enforce: bool = Field(False, description="false: audit what would be done, change nothing")
    act_on: dict[str, float] = Field(
        default_factory=lambda: {"rule": 0.0, "hang": 0.0, "silence": 60.0, "similarity": 120.0},
        description="alert kind -> seconds it must stay open before acting; others notify only",
    )
    opt_out_jobs: list[str] = Field(default_factory=list)
    max_per_job: int = Field(4, ge=1, description="breaker: machines of one job per window")
    max_fraction: float = Field(0.02, gt=0, le=1, description="breaker: share of the fleet")
    window_s: float = Field(3600.0, gt=0, description="breaker: sliding window")
    node_template: str = Field("{machine}", description="scheduler node name of a machine")
    scontrol: str = Field("scontrol", description="Slurm: the scontrol program")
    slurm_conf: Path | None = Field(None, description="Slurm: SLURM_CONF for scontrol")
    kubeconfig: str | None = Field(
        None, description="Kubernetes: kubeconfig path (else in-cluster)"
    )
    kube_context: str | None = None
    kube_job_label: str = Field(
        "job-name",
        description="Kubernetes: the pod label whose value is Minder's job id; a node is acted "
        "on only while it runs a pod of the alert's job carrying it",
    )
    kube_job_namespace: str | None = Field(
        None, description="Kubernetes: look for a job's pods in this namespace only (none: all)"
    )

    @field_validator("target", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("target")
    @classmethod
    def _check_target(cls, value: str) -> str:
        """The Kubernetes target needs the ``kubernetes`` extra (its client and tenacity)."""
        if value == "kubernetes":
            _needs_packages(
                "the Kubernetes target",
                {
                    "kubernetes": "kubernetes",
                    "urllib3": "kubernetes",
                    "tenacity": "tenacity",
                    "yaml": "pyyaml",
                },
                "choose target none or slurm",
            )
        return value


class SelfCheckSettings(BaseModel):
    """Self-checks of the nodes Minder drained (docs/selfcheck.md): off until ``enabled``, and
    acting only while the actions enforce (``MINDER_ACTIONS__ENFORCE``)."""

    KINDS: ClassVar[tuple[str, ...]] = ("rule", "similarity", "straggler", "silence", "hang")

    enabled: bool = Field(
        False, description="check the nodes Minder drained; needs a scheduler target"
    )
    kinds: list[str] | None = Field(
        None, description="alert kinds whose drained node gets a check; none = the acting kinds "
        "(MINDER_ACTIONS__ACT_ON)",
    )  # fmt: skip
    max_concurrent: int = Field(4, ge=1, le=1000, description="checks running at once")
    timeout_s: float = Field(600.0, gt=0, description="a launched check's wall time")
    retries: int = Field(
        1, ge=0, le=10, description="inconclusive or timed-out checks of an alert retried"
    )
    max_failures_per_node: int = Field(
        2,
        ge=1,
        description="a node whose checks failed this often gets no automatic check again: it "
        "stays out until a person acts",
    )
    partners: int = Field(
        3, ge=0, le=64, description="healthy idle nodes of the collective check (0: none)"
    )
    report_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="the API's base URL as the nodes reach it (http://minder:8080); required "
        "when enabled",
    )
    command: list[str] = Field(
        default_factory=lambda: ["minder", "selfcheck", "run"],
        description="argv prefix run on the nodes (JSON list); --report-url and --check-id are "
        "appended",
    )
    check_user: str | None = Field(
        None, description="Slurm: the user check jobs run as (none: the service's user)"
    )
    image: str = Field("minder:latest", description="Kubernetes: the check Job's image")
    namespace: str = Field("minder", description="Kubernetes: where check Jobs are created")
    master_port: int = Field(
        29590, ge=1, le=65535, description="TCP port of the collective check's rendezvous"
    )
    partition: str | None = Field(
        None, description="Slurm: partition of check jobs and partners (none: the node's own)"
    )
    sbatch_args: list[str] = Field(
        default_factory=lambda: ["--exclusive"],
        description="Slurm: extra sbatch options of check jobs (JSON list), e.g. "
        '["--exclusive", "--gres=gpu:8"] where cgroups confine devices to the allocated ones',
    )
    ready_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="a check waits this long for its node (its job still running) before it "
        "is inconclusive",
    )
    report_grace_s: float = Field(
        15.0, gt=0, description="a check's report may arrive this long after its job ended"
    )
    interval_s: float = Field(
        2.0, gt=0, le=60, description="the service's pass interval (also woken by events)"
    )

    @field_validator("kinds")
    @classmethod
    def _check_kinds(cls, value: list[str] | None) -> list[str] | None:
        for kind in value or ():
            if kind not in cls.KINDS:
                raise ValueError(f"unknown kind {kind[:40]!r}: expected {', '.join(cls.KINDS)}")
        return value

    @field_validator("command")
    @classmethod
    def _check_command(cls, value: list[str]) -> list[str]:
        if not value or not all(part.strip() for part in value):
            raise ValueError(
                "expected a non-empty JSON list of non-empty strings, e.g. "
                '["minder", "selfcheck", "run"]'
            )
        return value

    @field_validator("check_user", "partition", "report_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def model_post_init(self, context: Any, /) -> None:
        """Enabled checks need the URL the nodes report to."""
        if self.enabled and self.report_url is None:
            raise ValueError(
                "self-checks are enabled (MINDER_SELFCHECK__ENABLED=true) without "
                "MINDER_SELFCHECK__REPORT_URL: expected the API's base URL as the nodes reach "
                "it, e.g. http://minder:8080"
            )


class AuthSettings(BaseModel):
    """Signed node batches (docs/security.md): who may speak for a node."""

    mode: Literal["required", "permissive"] = Field(
        "required",
        description="required: batches whose signature does not hold are dead-lettered before "
        "they touch any state; permissive (migration): checked, counted and logged, but taken",
    )
    keys_file: Path | None = Field(
        None,
        description="the cluster key file (`minder keys init`); none = the systemd credential "
        "'minder-cluster-keys' if there is one",
    )
    max_age_s: float = Field(
        3600.0, gt=0, description="a batch signed longer ago than this is refused"
    )
    max_skew_s: float = Field(
        300.0, ge=0, description="a batch signed further ahead of this clock is refused"
    )

    @field_validator("keys_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        """``MINDER_AUTH__KEYS_FILE=`` (empty) means no file, not the current directory."""
        return None if isinstance(value, str) and not value.strip() else value


LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LogFormat = Literal["auto", "rich", "plain", "json"]


class LogSettings(BaseModel):
    """How the service logs (docs/operations.md, Logs); the level is ``MINDER_LOG_LEVEL``."""

    format: LogFormat = Field(
        "auto",
        description="rich: coloured, for a terminal; plain: one line per record with an ISO 8601 "
        "time (journald, kubectl logs); json: one JSON object per record; auto: rich on a "
        "terminal, plain otherwise",
    )

    @field_validator("format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


class _EnvSource(EnvSettingsSource):
    """The environment without the ``MINDER_*`` variables that are not settings
    (:data:`OTHER_VARIABLES`): ``MINDER_KAFKA=host:9092`` of the agent's unit is not the
    ``kafka`` section."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self.env_vars = {
            name: value for name, value in self.env_vars.items() if not is_other_variable(name)
        }


class Settings(BaseSettings):
    """Every setting of Minder."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_DELIMITER, env_file=None, extra="ignore"
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    prometheus: PrometheusSourceSettings = Field(default_factory=PrometheusSourceSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    alertmanager: AlertmanagerSettings = Field(default_factory=AlertmanagerSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    actions: ActionSettings = Field(default_factory=ActionSettings)
    selfcheck: SelfCheckSettings = Field(default_factory=SelfCheckSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    whatif: WhatIfSettings = Field(default_factory=WhatIfSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL")

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"unknown log level: expected {', '.join(LOG_LEVELS)}")
        return level

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _EnvSource(settings_cls), dotenv_settings, file_secret_settings

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Settings from the environment and ``overrides``; bad values raise one error.

        Every ``MINDER_*`` variable is checked: one that is neither a setting nor one of
        :data:`OTHER_VARIABLES` is refused with the closest setting's name.

        Raises
        ------
        SettingsError
            One line naming each unknown variable or the first bad one, its value (truncated)
            and what is allowed, e.g. ``MINDER_API__PORT='http': expected a valid integer``.
        """
        unknown = unknown_variables(os.environ)
        if unknown:
            raise SettingsError(unknown)
        try:
            return cls(**overrides)
        except PydanticValidationError as exc:
            raise SettingsError(describe_settings_error(exc)) from None
        except PydanticSettingsError as exc:
            # pydantic-settings could not parse a list/dict value as JSON; name the variable.
            raise SettingsError(_describe_unparsable(cls, exc)) from None


def setting_variables(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> list[str]:
    """Every variable that sets a setting, e.g. ``MINDER_API__PORT`` (a section holding models
    is not one: its fields are)."""
    names: list[str] = []
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        annotation = field.annotation
        options = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
        section = next(
            (a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
        if section is not None and get_origin(annotation) not in (list, dict):
            names.extend(setting_variables(section, variable + ENV_DELIMITER))
        else:
            names.append(variable)
    return names


def _dict_variables(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> list[str]:
    """The variables of dict settings, whose keys may be set one by one
    (``MINDER_ACTIONS__ACT_ON__RULE=0``)."""
    names: list[str] = []
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        annotation = field.annotation
        if get_origin(annotation) is dict:
            names.append(variable)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names.extend(_dict_variables(annotation, variable + ENV_DELIMITER))
    return names


def unknown_variables(environ: Mapping[str, str]) -> str | None:
    """One line naming each ``MINDER_*`` variable of ``environ`` that Minder does not know, with
    the closest known name (``did you mean MINDER_API__PORT?``); ``None`` when there is none."""
    settings = setting_variables()
    known = set(settings) | set(OTHER_VARIABLES)
    dicts = tuple(name + ENV_DELIMITER for name in _dict_variables())
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        if is_other_variable(upper) or upper.startswith(dicts):
            continue
        if KUBERNETES_SERVICE_LINK.match(upper):
            continue
        # compared without the prefix, which every name shares and which would make any two alike
        names = {name[len(ENV_PREFIX) :]: name for name in [*settings, *OTHER_VARIABLES]}
        close = difflib.get_close_matches(upper[len(ENV_PREFIX) :], names, n=1, cutoff=0.6)
        hint = f"did you mean {names[close[0]]}?" if close else "see docs/operations.md, Settings"
        problems.append(f"{name}={_shown(name, environ[name])}: not a Minder variable, {hint}")
    if not problems:
        return None
    return "unknown setting " + "; ".join(problems)


_SECRET_PARTS = ("secret", "token", "password")


def _shown(variable: str, value: object) -> str:
    """A value as an error message may show it: secrets hidden, passwords out of URLs, short."""
    if any(part in variable.lower() for part in _SECRET_PARTS):
        return "<hidden>"
    if isinstance(value, dict | list | tuple):
        return "<a JSON value>"  # may hold secrets (webhook endpoints): never echoed
    text = value if isinstance(value, str | int | float | bool) else str(value)
    shown = re.sub(r"(://[^:/@\s]+):[^@\s]*@", r"\1:***@", str(text))
    shown = repr(shown if isinstance(text, str) else text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def describe_settings_error(exc: PydanticValidationError) -> str:
    """One line per :class:`Settings` validation error: the variable, its value, what is allowed.

    An item of a list is named by its index (``MINDER_WEBHOOK__ENDPOINTS[0].url``); secret values
    and the password of a URL are never shown.
    """
    problems = []
    for error in exc.errors(include_url=False):
        variable = ENV_PREFIX.rstrip("_")
        for position, part in enumerate(error.get("loc", ())):
            if isinstance(part, int):
                variable += f"[{part}]"
            elif position == 0 or "[" not in variable:
                variable += ("_" if position == 0 else ENV_DELIMITER) + str(part).upper()
            else:
                variable += f".{part}"
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        shown = _shown(variable, error.get("input"))
        problems.append(f"{variable}={shown}: {message[:1].lower()}{message[1:]}")
    return "bad setting " + "; ".join(problems) if problems else f"bad settings: {exc}"


def _describe_unparsable(settings: type[BaseSettings], exc: Exception) -> str:
    for name, value in sorted(os.environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER)
        model: Any = settings
        field = None
        for part in path:
            fields = getattr(model, "model_fields", {})
            field = fields.get(part)
            if field is None:
                break
            model = field.annotation
        if field is None or get_origin(field.annotation) not in (list, dict):
            continue
        try:
            json.loads(value)
        except ValueError:
            shown = _shown(name, value)
            return (
                f"bad setting {name}={shown}: expected JSON, e.g. "
                f"{name}='[\"http://receiver:9000/hook\"]' for a list"
            )
    return f"bad settings: {exc}"
