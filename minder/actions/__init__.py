"""Scheduler actions: take a faulty machine out of the scheduler's pool, and give it back.

One module per target behind one interface (:class:`~minder.actions.base.NodeActuator`):
:mod:`minder.actions.slurm` (``scontrol`` drain/resume) and :mod:`minder.actions.kubernetes`
(cordon, a ``NoSchedule`` taint and a node condition). Policy, the circuit breaker and the audit
trail sit in front of them (docs/architecture.md §6).
"""
