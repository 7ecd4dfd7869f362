"""Settings of the service and CLI (pydantic-settings, prefix ``MINDER_``, nested with ``__``).

Only entry points (the CLI, the API app factory) build :class:`Settings`; libraries take plain
arguments. Example: ``MINDER_KAFKA__BOOTSTRAP=broker:9092 MINDER_DATABASE__URL=postgresql+psycopg://…``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal, Self, get_origin

from pydantic import BaseModel, Field
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from detectors.base import DetectorFactory
from detectors.config import DetectorConfig
from minder.core.errors import ValidationError
from minder.core.records import ALERTS_TOPIC, DEADLETTER_TOPIC, METRICS_TOPIC

ENV_PREFIX = "MINDER_"
ENV_DELIMITER = "__"


class SettingsError(ValidationError):
    """A ``MINDER_*`` variable holds a value that is not allowed."""


class KafkaSettings(BaseModel):
    """Where the metrics come from and alerts go."""

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
    publish_alerts: bool | None = Field(
        None,
        description="publish alerts on the alerts topic; none = when Kafka is a metrics source "
        "(a Prometheus-only service then needs no broker)",
    )


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


class ApiSettings(BaseModel):
    """HTTP API."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    token: str | None = Field(
        None, description="bearer token required by mutating endpoints (PATCH); none = open"
    )
    external_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="how operators reach this API (links in Alertmanager and webhooks)",
    )


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

    def detector_config(self) -> DetectorConfig:
        """These parameters as the detector takes them."""
        return DetectorConfig(
            window_s=self.window_s,
            threshold=self.threshold,
            continuity_s=self.continuity_s,
            silence_s=self.silence_s,
            min_machines=self.min_machines,
            denoiser=self.denoiser,
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
    retain_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="delivered and expired events are kept this long"
    )


class ActionSettings(BaseModel):
    """Scheduler actions (drain, cordon): log-only until ``enforce`` is true."""

    target: Literal["none", "slurm", "kubernetes"] = "none"
    enforce: bool = Field(False, description="false: audit what would be done, change nothing")
    act_on: dict[str, float] = Field(
        default_factory=lambda: {"rule": 0.0, "silence": 60.0, "similarity": 120.0},
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
    whatif: WhatIfSettings = Field(default_factory=WhatIfSettings)
    log_level: str = "INFO"

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Settings from the environment and ``overrides``; bad values raise one error.

        Raises
        ------
        SettingsError
            Naming the first bad variable, its value (truncated) and what is allowed, e.g.
            ``MINDER_API__PORT='http': expected a valid integer``.
        """
        try:
            return cls(**overrides)
        except PydanticValidationError as exc:
            raise SettingsError(describe_settings_error(exc)) from None
        except PydanticSettingsError as exc:
            # pydantic-settings could not parse a list/dict value as JSON; name the variable.
            raise SettingsError(_describe_unparsable(cls, exc)) from None


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
