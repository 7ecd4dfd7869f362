"""Run detector variants over a suite: train once, simulate each case once, replay it for each
variant, score the alerts.

A *variant* is one row of the report: a method of :mod:`detectors.methods` (``minder``,
``pairwise`` or a baseline), optionally with ablations (``minder (no_denoiser)``) or with a
model trained with another denoiser (``minder [pca]``). Engine variants use the model trained on
:func:`~minder.benchmark.suite.build_training_suite` (other seeds than the test suite) unless
training is off or unavailable; baselines take no model.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pandas as pd
from pandas.api.types import union_categoricals

from collectors.sim import scenario_labels, simulate_table
from detectors.base import DetectorFactory
from detectors.config import DetectorConfig
from detectors.methods import ABLATIONS, BASELINE_METHODS, ENGINE_METHODS, METHODS, method_factory
from minder.benchmark.evaluate import (
    SLACK_S,
    STRAGGLER_FAULTS,
    CaseRun,
    Summary,
    summarize,
)
from minder.benchmark.replay import DEFAULT_GRACE_S, replay, simulate
from minder.benchmark.suite import (
    INDEPENDENT_SUITES,
    SUITES,
    BenchCase,
    build_suite,
    build_training_suite,
)
from minder.benchmark.truth import slowdown_replay
from minder.core.errors import MinderError
from minder.core.table import normalize_table

if TYPE_CHECKING:
    from detectors.model import DetectorModel

logger = logging.getLogger(__name__)

DEFAULT_DENOISER = "mean"
"""Denoiser of the model behind the plain ``minder`` and ``pairwise`` rows."""
DEFAULT_MAX_MACHINES: dict[str, int] = {"pairwise": 512, "lof": 512, "iforest": 512}
"""Largest job each slow method is run on by default (O(N^2) or costly per-second fits)."""
DEFAULT_CACHE_BYTES = 512 * 2**20
"""A case whose deliveries fit in this is simulated once and kept; a bigger one is regenerated
for each variant (the simulator is deterministic, so every variant sees the same data)."""

RunProgress = Callable[[str, float, int], None]
"""``progress(description, tasks_done, tasks_total)``; a task is one case for one variant."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of the report.

    Attributes
    ----------
    label
        ``minder``, ``minder (no_denoiser)``, ``minder [pca]`` …
    method
        Name in :data:`detectors.methods.METHODS`.
    ablations
        Parts of the engine switched off.
    denoiser
        Denoiser of this row's model (None: :data:`DEFAULT_DENOISER`); engine methods only.
    interval_s
        Sampling interval the detector sees (the suite resampled as a scrape would see it,
        :class:`~minder.benchmark.replay.Resampler`); 1 is the agent's every second.
    """

    label: str
    method: str
    ablations: tuple[str, ...] = ()
    denoiser: str | None = None
    interval_s: int = 1

    @property
    def is_engine(self) -> bool:
        """Our engine (takes a model and ablations), not a baseline."""
        return self.method in ENGINE_METHODS

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "method": self.method,
            "ablations": list(self.ablations),
            "denoiser": self.denoiser,
            "interval_s": self.interval_s,
        }


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What ``minder bench detect`` runs.

    Attributes
    ----------
    suite, seed
        Which cases (:func:`~minder.benchmark.suite.build_suite`).
    methods
        Methods, one row each.
    ablations
        Add a ``minder (ablation)`` row for each of :data:`detectors.methods.ABLATIONS`.
    denoisers
        Add a ``minder [denoiser]`` row for each.
    train
        Train the engine's model on the training suite first.
    max_machines
        Per method, the largest job it is run on (bigger cases are skipped and reported).
    cache_bytes
        See :data:`DEFAULT_CACHE_BYTES`.
    grace_s
        Seconds each second waits for late samples before it is evaluated.
    config
        Detector parameters (default :class:`DetectorConfig`).
    intervals
        Sampling intervals (seconds) to run every row at; rows at an interval above 1 are
        labelled ``minder @15s``.
    """

    suite: str = "standard"
    seed: int = 0
    methods: tuple[str, ...] = ("minder",)
    ablations: bool = False
    denoisers: tuple[str, ...] = ()
    train: bool = True
    max_machines: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_MAX_MACHINES))
    cache_bytes: int = DEFAULT_CACHE_BYTES
    grace_s: int = DEFAULT_GRACE_S
    config: DetectorConfig | None = None
    intervals: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        if self.suite not in SUITES and self.suite not in INDEPENDENT_SUITES:
            names = ", ".join([*SUITES, *INDEPENDENT_SUITES])
            raise ValueError(f"unknown suite {self.suite!r}: expected one of {names}")
        if not self.methods and not self.ablations and not self.denoisers:
            raise ValueError("no method to run: expected at least one of " + ", ".join(METHODS))
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}: expected some of {', '.join(METHODS)}")
        unknown = [m for m in self.max_machines if m not in METHODS]
        if unknown:
            raise ValueError(
                f"max_machines names unknown method(s) {unknown}: expected some of "
                f"{', '.join(METHODS)}"
            )
        from detectors.denoisers import DENOISER_KINDS  # noqa: PLC0415

        unknown = [d for d in self.denoisers if d not in DENOISER_KINDS]
        if unknown:
            raise ValueError(
                f"unknown denoiser(s) {unknown}: expected some of {', '.join(DENOISER_KINDS)}"
            )
        bad = [i for i in self.intervals if not 1 <= i <= 300]
        if bad or not self.intervals:
            raise ValueError(
                f"intervals {list(self.intervals)!r}: expected 1 to 300 seconds, at least one"
            )
        if self.seed < 0 or self.grace_s < 0 or self.cache_bytes < 0:
            raise ValueError(
                f"seed={self.seed!r}, grace_s={self.grace_s!r}, cache_bytes={self.cache_bytes!r}:"
                " expected non-negative numbers"
            )


def slack_for(interval_s: int) -> float:
    """How long after a fault ends an alert still counts: a minute, or five samples at coarse
    sampling (silence there takes three missed samples, plus the tick and the wait for a
    batch)."""
    return max(SLACK_S, 5.0 * interval_s)


def plan_variants(options: BenchOptions) -> list[Variant]:
    """The report's rows, in order: methods, then ablations, then denoisers."""
    out = [Variant(m, m) for m in dict.fromkeys(options.methods)]
    if options.ablations:
        out += [Variant(f"minder ({a})", "minder", (a,)) for a in ABLATIONS]
    for d in dict.fromkeys(options.denoisers):
        if d == DEFAULT_DENOISER and "minder" in options.methods:
            continue  # the plain minder row is this one
        out.append(Variant(f"minder [{d}]", "minder", (), d))
    intervals = list(dict.fromkeys(options.intervals))
    return [
        v if i == 1 else replace(v, label=f"{v.label} @{i}s", interval_s=i)
        for i in intervals
        for v in out
    ]


def command_line(options: BenchOptions) -> str:
    """The ``minder bench detect`` command that reproduces ``options``."""
    parts = ["minder", "bench", "detect", "--suite", options.suite]
    parts += ["--methods", ",".join(options.methods)] if options.methods else []
    if options.ablations:
        parts.append("--ablations")
    if options.denoisers:
        parts += ["--denoisers", ",".join(options.denoisers)]
    parts += ["--seed", str(options.seed), "--train" if options.train else "--no-train"]
    if dict(options.max_machines) != DEFAULT_MAX_MACHINES:
        limits = ",".join(f"{k}={v}" for k, v in sorted(options.max_machines.items()))
        parts += ["--max-machines-for", limits or "none"]
    if options.grace_s != DEFAULT_GRACE_S:
        parts += ["--grace", str(options.grace_s)]
    if options.intervals != (1,):
        parts += ["--intervals", ",".join(map(str, options.intervals))]
    return shlex.join(parts)


# -- results ---------------------------------------------------------------------------------


@dataclass(slots=True)
class VariantResult:
    """One row: a variant's summary and what it did not run."""

    variant: Variant
    trained: bool
    detector: str
    summary: Summary
    cases_run: int
    skipped: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, with_cases: bool = True) -> dict[str, Any]:
        return {
            **self.variant.to_dict(),
            "trained": self.trained,
            "detector": self.detector,
            "cases_run": self.cases_run,
            "skipped": self.skipped,
            "errors": self.errors,
            **self.summary.to_dict(with_cases),
        }


@dataclass(slots=True)
class BenchResult:
    """Everything one ``minder bench detect`` run measured."""

    options: BenchOptions
    cases: list[BenchCase]
    rows: list[VariantResult]
    notes: list[str] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    simulate_cpu_s: float = 0.0

    @property
    def command(self) -> str:
        """The command line that reproduces this run."""
        return command_line(self.options)

    def to_dict(self, with_cases: bool = True) -> dict[str, Any]:
        """Plain data for ``--format json`` / ``--output``."""
        free = [c for c in self.cases if c.is_fault_free]
        return {
            "command": self.command,
            "suite": self.options.suite,
            "seed": self.options.seed,
            "train": self.options.train,
            "grace_s": self.options.grace_s,
            "suite_summary": {
                "cases": len(self.cases),
                "faulty_cases": len(self.cases) - len(free),
                "fault_free_cases": len(free),
                "fault_free_machine_hours": sum(c.machine_hours for c in free),
                "machine_hours": sum(c.machine_hours for c in self.cases),
                "sizes": sorted({c.machines for c in self.cases}),
                "faults": _count(c.fault for c in self.cases if c.fault),
            },
            "cases": [
                {
                    "name": c.name,
                    "fault": c.fault,
                    "machines": c.machines,
                    "duration_s": c.duration_s,
                    "fault_free": c.is_fault_free,
                    "detail": c.detail,
                }
                for c in self.cases
            ],
            "training": self.training,
            "notes": self.notes,
            "rows": [r.to_dict(with_cases) for r in self.rows],
            "wall_s": round(self.wall_s, 2),
            "simulate_cpu_s": round(self.simulate_cpu_s, 2),
        }


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


# -- training --------------------------------------------------------------------------------


def training_data(cases: Sequence[BenchCase]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One canonical table of every case (a job each) and their labels."""
    tables = [simulate_table(case.scenario) for case in cases]
    columns: dict[str, Any] = {}
    for column in tables[0].columns:
        parts = [t[column] for t in tables]
        if isinstance(parts[0].dtype, pd.CategoricalDtype):
            columns[column] = union_categoricals(parts, sort_categories=True)
        else:
            columns[column] = pd.concat(parts, ignore_index=True)
        for t in tables:
            del t[column]  # free each column as soon as it is joined
    table = normalize_table(pd.DataFrame(columns, copy=False))
    labels = pd.concat([scenario_labels(case.scenario) for case in cases], ignore_index=True)
    return table, labels


def _train(
    options: BenchOptions,
    denoisers: Sequence[str],
    notes: list[str],
    progress: RunProgress | None,
    total: int,
) -> tuple[dict[str, DetectorModel], dict[str, Any]]:
    """Models by denoiser; a denoiser that cannot be trained is left out with a note."""
    try:
        from detectors.training import train_model  # noqa: PLC0415
    except ImportError as exc:
        message = f"training is not available ({exc}): every variant runs untrained"
        logger.warning(message)
        notes.append(message)
        return {}, {"error": str(exc)}
    began = time.perf_counter()
    cases = build_training_suite(options.seed)
    if progress is not None:
        progress("simulating the training suite", 0, total)
    table, labels = training_data(cases)
    info: dict[str, Any] = {
        "cases": len(cases),
        "rows": len(table),
        "faults": len(labels.drop_duplicates(["job", "fault_index"])),
        "simulate_s": round(time.perf_counter() - began, 2),
        "models": {},
    }
    models: dict[str, DetectorModel] = {}
    for denoiser in denoisers:
        if progress is not None:
            progress(f"training [{denoiser}]", 0, total)
        tic = time.perf_counter()
        try:
            models[denoiser] = train_model(table, labels, denoiser=denoiser, config=options.config)
        except (ImportError, MinderError, ValueError) as exc:
            message = f"could not train a model with denoiser {denoiser!r}: {exc}"
            logger.warning(message)
            notes.append(message)
            continue
        info["models"][denoiser] = {"train_s": round(time.perf_counter() - tic, 2)}
    return models, info


# -- detectors -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Prepared:
    variant: Variant
    factory: DetectorFactory
    trained: bool
    detector: str


def _prepare(
    variant: Variant,
    options: BenchOptions,
    models: Mapping[str, DetectorModel],
    notes: list[str],
) -> _Prepared | str:
    """The variant's detector factory, or why it cannot run."""
    config = options.config or DetectorConfig()
    model = None
    if variant.is_engine:
        denoiser = variant.denoiser or DEFAULT_DENOISER
        model = models.get(denoiser)
        if model is None:
            # Untrained: the engine filters every metric with the config's denoiser.
            config = replace(config, denoiser=denoiser)
            if options.train and variant.denoiser is not None:
                notes.append(f"{variant.label} runs untrained (no model for {denoiser!r})")
    try:
        factory = method_factory(
            variant.method, config=config, model=model, ablations=variant.ablations
        )
        probe = factory()
    except (ImportError, MinderError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return _Prepared(variant, factory, model is not None, type(probe).__name__)


# -- the run ---------------------------------------------------------------------------------


def prepare_variants(
    options: BenchOptions,
    variants: Sequence[Variant],
    notes: list[str],
    progress: RunProgress | None,
    total: int,
) -> tuple[list[_Prepared], dict[str, str], dict[str, Any]]:
    """Train the engine's models when asked, then build each variant's detector factory.

    Returns the variants ready to run, those that cannot (label -> reason, also in ``notes``)
    and what the training did."""
    models: dict[str, DetectorModel] = {}
    training: dict[str, Any] = {"enabled": options.train}
    if options.train and any(v.is_engine for v in variants):
        wanted = list(
            dict.fromkeys(v.denoiser or DEFAULT_DENOISER for v in variants if v.is_engine)
        )
        models, info = _train(options, wanted, notes, progress, total)
        training.update(info)
    prepared: list[_Prepared] = []
    failed: dict[str, str] = {}
    for variant in variants:
        ready = _prepare(variant, options, models, notes)
        if isinstance(ready, str):
            failed[variant.label] = ready
            message = f"{variant.label} cannot run: {ready}"
            logger.warning(message)
            notes.append(message)
        else:
            prepared.append(ready)
    return prepared, failed, training


def variant_rows(
    prepared: Sequence[_Prepared],
    variants: Sequence[Variant],
    runs: dict[str, list[CaseRun]],
    skipped: dict[str, list[dict[str, Any]]],
    errors: dict[str, list[dict[str, Any]]],
    failed: dict[str, str],
) -> list[VariantResult]:
    """One result row per variant, in the order asked: the scored ones, and those that could
    not be prepared (``failed``: label -> reason) with nothing run."""
    rows = [
        VariantResult(
            variant=p.variant,
            trained=p.trained,
            detector=p.detector,
            summary=summarize(runs[p.variant.label], slack_s=slack_for(p.variant.interval_s)),
            cases_run=len(runs[p.variant.label]),
            skipped=skipped[p.variant.label],
            errors=errors[p.variant.label],
        )
        for p in prepared
    ]
    for label, reason in failed.items():
        variant = next(v for v in variants if v.label == label)
        rows.append(
            VariantResult(
                variant=variant,
                trained=False,
                detector="",
                summary=summarize([]),
                cases_run=0,
                skipped=[{"case": "*", "machines": 0, "reason": reason}],
            )
        )
    order = {v.label: i for i, v in enumerate(variants)}
    rows.sort(key=lambda r: order[r.variant.label])
    return rows


def run_benchmark(
    options: BenchOptions,
    *,
    cases: Sequence[BenchCase] | None = None,
    progress: RunProgress | None = None,
) -> BenchResult:
    """Run every variant of ``options`` over the suite (or ``cases``) and score them."""
    if options.suite in INDEPENDENT_SUITES and cases is None:
        raise ValueError(
            f"suite {options.suite!r} is run by minder.benchmark.independent.run."
            "run_independent: expected a simulator suite here"
        )
    began = time.perf_counter()
    suite = list(cases) if cases is not None else build_suite(options.suite, options.seed)
    variants = plan_variants(options)
    total = len(suite) * len(variants)
    notes: list[str] = []
    prepared, failed, training = prepare_variants(options, variants, notes, progress, total)

    runs: dict[str, list[CaseRun]] = {p.variant.label: [] for p in prepared}
    skipped: dict[str, list[dict[str, Any]]] = {p.variant.label: [] for p in prepared}
    errors: dict[str, list[dict[str, Any]]] = {p.variant.label: [] for p in prepared}
    done = float(len(suite) * len(failed))
    simulate_cpu = 0.0
    all_cases = list(suite)
    for interval in dict.fromkeys(v.interval_s for v in variants):
        at_interval = [p for p in prepared if p.variant.interval_s == interval]
        cases_here = suite
        if cases is None and interval != 1:
            # Coarse sampling needs longer cases past each onset (suite.POST_SAMPLES).
            cases_here = build_suite(options.suite, options.seed, interval)
            names = {c.name: c for c in all_cases}
            all_cases += [c for c in cases_here if names.get(c.name) != c]
        for case in cases_here:
            labels = scenario_labels(case.scenario)
            todo = []
            for p in at_interval:
                limit = options.max_machines.get(p.variant.method, 0)
                if limit and case.machines > limit:
                    skipped[p.variant.label].append(
                        {
                            "case": case.name,
                            "machines": case.machines,
                            "reason": f"{case.machines} machines > {limit} for {p.variant.method}",
                        }
                    )
                    done += 1
                else:
                    todo.append(p)
            if not todo:
                continue
            simulated = simulate(case.scenario, options.cache_bytes if len(todo) > 1 else 0)
            simulate_cpu += simulated.simulate_cpu_s
            for p in todo:
                label = f"{p.variant.label} · {case.name}"

                def tick(seconds: int, of: int, label: str = label, base: float = done) -> None:
                    if progress is not None:
                        progress(label, base + seconds / max(of, 1), total)

                tick(0, 1)
                try:
                    result = replay(
                        simulated,
                        p.factory,
                        grace_s=options.grace_s,
                        progress=tick,
                        interval_s=interval,
                    )
                except Exception as exc:  # one failing case must not lose a long run
                    logger.exception("%s failed on %s", p.variant.label, case.name)
                    errors[p.variant.label].append(
                        {"case": case.name, "error": f"{type(exc).__name__}: {exc}"}
                    )
                else:
                    simulate_cpu += result.simulate_cpu_s
                    runs[p.variant.label].append(
                        CaseRun(
                            name=case.name,
                            fault=case.fault,
                            machines=case.machines,
                            labels=labels,
                            alerts=result.alerts,
                            detect_cpu_s=result.detect_cpu_s,
                            job_seconds=float(result.job_seconds),
                            machine_seconds=result.machine_seconds,
                            step_s=float(case.scenario.jobs[0].step_time_s),
                            replay=slowdown_replay(case.scenario)
                            if case.fault in STRAGGLER_FAULTS
                            else None,
                        )
                    )
                done += 1
                if progress is not None:
                    progress(label, done, total)
            del simulated

    rows = variant_rows(prepared, variants, runs, skipped, errors, failed)
    if any(v.method in BASELINE_METHODS for v in variants) and options.train:
        notes.append("baselines take no trained model; they run as they are")
    return BenchResult(
        options=options,
        cases=all_cases,
        rows=rows,
        notes=notes,
        training=training,
        wall_s=time.perf_counter() - began,
        simulate_cpu_s=simulate_cpu,
    )
