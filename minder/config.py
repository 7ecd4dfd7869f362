"""Settings of the service and CLI (pydantic-settings, prefix ``MINDER_``, nested with ``__``).

Only entry points (the CLI, the API app factory) build :class:`Settings`; libraries take plain
arguments. Example: ``MINDER_KAFKA__BOOTSTRAP=broker:9092 MINDER_DATABASE__URL=postgresql+psycopg://…``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from detectors.base import DetectorFactory
from detectors.config import DetectorConfig
from minder.core.records import ALERTS_TOPIC, DEADLETTER_TOPIC, METRICS_TOPIC


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


class WebhookSettings(BaseModel):
    """Alert webhooks to the scheduler."""

    urls: list[str] = Field(default_factory=list)
    timeout_s: float = Field(5.0, gt=0)


class Settings(BaseSettings):
    """Every setting of Minder."""

    model_config = SettingsConfigDict(
        env_prefix="MINDER_", env_nested_delimiter="__", env_file=None, extra="ignore"
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    whatif: WhatIfSettings = Field(default_factory=WhatIfSettings)
    log_level: str = "INFO"
