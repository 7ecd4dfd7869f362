"""Fault episodes: one fault, one alert; silence and link-down wait for their domain.

A condition on a machine (a rule family, or similarity on a metric) opens an *episode* the first
second it holds; it stays open while the condition keeps recurring and ends ``rearm_s`` after
the last time it held, so seeing it again later is a new fault. Silence and link-down findings
wait ``settle_s`` for their domain neighbours: when enough machines of one domain fail together,
one alert names the domain instead of each machine.

Machines that fall silent together (within ``batch_spread_s`` of each other, at least
``batch_min_machines``) while the rest of the job reports left the job together: a scale-down or
a scheduler's kill, which is one membership change of the job and no alert. Only when they are
one domain, and enough of it, is it a fault: the domain's switch or rack.

A batch that fell silent together and comes back (at least half of it reports again within
``OUTAGE_RETURN_S``, 10 minutes, without having said goodbye) was not scaled down: a scheduler
replaces machines it removed, it does not bring the same ones back minutes later. It was unreachable
together (a switch without domain labels, a partition): one alert then, when they are back,
naming their common domain or, without one, each machine.
"""

from __future__ import annotations

import math

from detectors.config import Cadence, DetectorConfig
from detectors.findings import Finding
from detectors.window import JobWindow
from minder.core.alert import AlertKind

OUTAGE_RETURN_S = 600
"""A silent batch that reports again within this long was unreachable, not scaled down. Short:
an elastic job scaled down and up again onto the same nodes would read as an outage too."""
DOMAIN_FAMILIES = frozenset({"silence", "nic"})
"""Rule families whose findings may be a shared domain's fault."""


class Episodes:
    """Open episodes of one job, keyed by ``(machine, family)``."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.cadence: Cadence = config.at_interval(1.0)
        """Durations at the job's sampling interval (set by the detector)."""
        # (machine, family) -> last second the condition held.
        self.active: dict[tuple[int, str], int] = {}
        # (machine, family) -> (second it was first seen, finding), waiting for its domain.
        self._pending: dict[tuple[int, str], tuple[int, Finding]] = {}
        # Domains with an open domain-wide episode -> the machines it covers.
        self._domain_members: dict[str, set[int]] = {}
        # Batches taken for a scale-down: (machines, silent since, their silence findings).
        self._departed: list[tuple[list[int], int, list[Finding]]] = []

    def touch(self, key: tuple[int, str], now: int) -> bool:
        """Record that ``key`` holds at ``now``; True when this starts a new episode."""
        new = key not in self.active
        self.active[key] = now
        return new

    def hold(self, finding: Finding, now: int) -> None:
        """Keep a new silence / link-down finding until its domain had time to show."""
        self._pending[(finding.machine, finding.family)] = (now, finding)

    def expire(self, now: int) -> None:
        """End the episodes whose condition has been absent for ``rearm_s``."""
        limit = self.cadence.rearm_s
        for key in [k for k, last in self.active.items() if now - last > limit]:
            del self.active[key]
            self._pending.pop(key, None)
        active_machines = {m for m, _ in self.active}
        for domain in [d for d, ms in self._domain_members.items() if not ms & active_machines]:
            del self._domain_members[domain]

    def machines_in(self, families: frozenset[str]) -> set[int]:
        """Machines with an open episode of one of ``families``."""
        return {m for (m, family) in self.active if family in families}

    def settle(self, window: JobWindow, now: int) -> list[Finding]:
        """Held findings whose wait is over: one domain finding where enough of a domain
        failed together, nothing (a membership change) where a batch of machines fell silent
        together, the machines' own findings otherwise."""
        cadence = self.cadence
        returned = self._returned(window, now)
        ready = {
            k
            for k, (seen, _) in self._pending.items()
            if now - seen >= (cadence.silence_settle_s if k[1] == "silence" else cadence.settle_s)
        }
        if not ready:
            return returned
        out: list[Finding] = returned
        for batch in self._silent_batches():
            if not all(k in ready for k in batch):
                ready -= set(batch)  # the newest of the batch still waits for its neighbours
                continue
            if len(batch) < self.config.batch_min_machines:
                continue  # a lone machine: its own or its domain's finding, below
            ready -= set(batch)
            out += self._settle_batch(window, now, batch)
        by_domain: dict[str, list[tuple[int, str]]] = {}
        for key in ready:
            by_domain.setdefault(window.machines[key[0]].domain, []).append(key)
        for domain, keys in by_domain.items():
            if domain:
                in_domain = [k for k in self._pending if window.machines[k[0]].domain == domain]
                members = {m for m, _ in in_domain} | self._domain_members.get(domain, set())
                if len(members) >= self._domain_needed(window, domain):
                    findings = [self._pending.pop(k)[1] for k in in_domain]
                    if domain not in self._domain_members:
                        out.append(domain_finding(window, domain, findings, sorted(members)))
                    self._domain_members[domain] = members
                    continue
            out.extend(self._pending.pop(k)[1] for k in keys)
        return out

    def _returned(self, window: JobWindow, now: int) -> list[Finding]:
        """Batches taken for a scale-down that report again: they were unreachable together.
        One finding each (their common domain's, or each machine's); batches gone for longer
        than :data:`OUTAGE_RETURN_S` were scaled down indeed and are forgotten."""
        if not self._departed:
            return []
        active = window.active()
        out: list[Finding] = []
        keep = []
        for machines, first, findings in self._departed:
            back = [m for m in machines if active[m] and window.joined_sec[m] > first]
            if 2 * len(back) >= len(machines):
                for finding in findings:
                    finding.evidence["returned_after_s"] = now - first
                    finding.evidence["outage"] = "the batch fell silent together and came back"
                domains = {window.machines[m].domain for m in machines}
                domain = next(iter(domains))
                if len(domains) == 1 and domain:
                    out.append(domain_finding(window, domain, findings, sorted(machines)))
                else:
                    out.extend(findings)
            elif now - first <= OUTAGE_RETURN_S:
                keep.append((machines, first, findings))
        self._departed = keep
        return out

    def _domain_needed(self, window: JobWindow, domain: str) -> int:
        """Machines of ``domain`` that must fail together: a share of those in the job now
        (machines that left earlier do not count)."""
        active = window.active()
        size = sum(
            1 for m, info in enumerate(window.machines) if info.domain == domain and active[m]
        )
        return max(self.config.domain_min_machines, math.ceil(self.config.domain_fraction * size))

    def _silent_batches(self) -> list[list[tuple[int, str]]]:
        """Held silence findings grouped by onset: a new batch starts after a gap longer than
        ``batch_spread_s``."""
        held = sorted(
            (finding.first_sec, key)
            for key, (_, finding) in self._pending.items()
            if key[1] == "silence"
        )
        batches: list[list[tuple[int, str]]] = []
        last = None
        for first, key in held:
            if last is None or first - last > self.cadence.batch_spread_s:
                batches.append([])
            batches[-1].append(key)
            last = first
        return batches

    def _settle_batch(
        self, window: JobWindow, now: int, batch: list[tuple[int, str]]
    ) -> list[Finding]:
        """Machines that fell silent together: their domain's fault when they are (enough of)
        one domain, else a membership change of the job."""
        findings = {k[0]: self._pending.pop(k)[1] for k in batch}
        machines = sorted(findings)
        domains = {window.machines[m].domain for m in machines}
        domain = next(iter(domains))
        # One domain, and enough of it, is that domain's fault. Machines of several domains
        # falling silent together are a scale-down: a switch takes only its own machines (a
        # whole rack plus an unrelated crash in the same seconds is taken for one too).
        if len(domains) == 1 and domain:
            known = set(machines) | self._domain_members.get(domain, set())
            if len(known) >= self._domain_needed(window, domain):
                new = domain not in self._domain_members
                self._domain_members[domain] = known
                if not new:
                    return []
                return [domain_finding(window, domain, list(findings.values()), sorted(known))]
        reporting = int(window.active().sum()) - len(machines)
        first = min(f.first_sec for f in findings.values())
        self._departed.append((machines, first, list(findings.values())))
        window.depart(
            machines,
            "left_together",
            float(first),
            f"{len(machines)} machines fell silent within "
            f"{self.cadence.batch_spread_s:.0f} s of each other while {reporting} kept reporting",
        )
        return []


def domain_finding(
    window: JobWindow, domain: str, findings: list[Finding], machines: list[int]
) -> Finding:
    """One finding that blames ``domain`` for its machines' findings."""
    first = min(f.first_sec for f in findings)
    kinds = sorted({f.kind.value for f in findings})
    kind = AlertKind.SILENCE if kinds == ["silence"] else AlertKind.RULE
    metric = findings[0].metric if len({f.metric for f in findings}) == 1 else "domain"
    domain_size = sum(1 for info in window.machines if info.domain == domain)
    return Finding(
        machine=machines[0],
        kind=kind,
        family="domain",
        metric=metric,
        score=len(machines) / max(domain_size, 1),
        first_sec=first,
        devices=(),
        evidence={
            "rule": "domain",
            "domain": domain,
            "domain_members": [window.machines[m].name for m in machines],
            "domain_size": domain_size,
            "member_rules": sorted({str(f.evidence.get("rule")) for f in findings}),
        },
    )


def merge_devices(findings: list[Finding]) -> list[Finding]:
    """One finding per (machine, family) of one second, with the union of their devices."""
    merged: dict[tuple[int, str], Finding] = {}
    for finding in findings:
        key = (finding.machine, finding.family)
        first = merged.get(key)
        if first is None:
            merged[key] = finding
            continue
        first.devices = first.devices + tuple(d for d in finding.devices if d not in first.devices)
        first.score = max(first.score, finding.score)
        first.first_sec = min(first.first_sec, finding.first_sec)
    return list(merged.values())
