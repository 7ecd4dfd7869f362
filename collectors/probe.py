"""Step probe: training processes report each step's duration and busy time to the node agent.

In the training loop::

    from collectors import probe

    for batch in loader:
        with probe.timer():  # or: probe.step(seconds) with a time you measured
            batch = move(batch)
            with probe.busy():  # compute, outside blocking collectives
                loss = forward_backward(batch)
            all_reduce(grads)  # a blocking collective: not busy
            with probe.busy():
                optimizer.step()

``busy`` blocks add up within the current step; a step without any reports no busy time (absent,
not 0). A time measured elsewhere goes in directly: ``probe.step(seconds, busy=busy_s)``. The
probe numbers the steps it reports 0, 1, 2 …; ``probe.step(seconds, number=n)`` (or
``with probe.timer() as t: ... t.number = n``) says which step this was, e.g. after a restart
from a checkpoint, and later steps count on from it.

Each ``step`` sends one datagram ``b"minder2 <rank> <step> <seconds> <busy>"`` (``busy`` is
``-`` when none was measured) to the agent (``MINDER_PROBE_ADDR``, default ``127.0.0.1:9477``)
from a non-blocking socket: it never waits and never raises into the loop. A datagram that
cannot be sent (no agent, full buffer, bad address) is counted in ``StepProbe.dropped``; a step
time that is not a finite number > 0, or a busy time that is negative or longer than the step,
is counted in ``StepProbe.ignored``; the loop goes on. The agent side is :class:`ProbeSource`,
which reports per rank per interval ``train_step_seconds`` (the mean of the steps received),
``train_busy_seconds`` (the mean busy time of the steps that reported one) and
``train_step_number`` (the last step's number). It still accepts the version-1 datagram
``b"minder1 <rank> <seconds>"`` of older probes (a step time alone).

A loop that stops stepping on purpose says so, so that the stop is not taken for a hang
(docs/hangs.md)::

    with probe.pause("checkpoint"):
        save_checkpoint(model)

``pause`` sends ``b"minder2 <rank> pause 1 <reason>"`` when the block starts and
``b"minder2 <rank> pause 0 <reason>"`` when it ends (nested blocks once; the reason is a short
word, e.g. ``checkpoint``, ``eval``). The agent then reports ``train_paused_seconds`` for that
rank: how long it has been paused, every interval while it is, and 0 in the interval it ended
(a step from the rank ends its pause too, should the end datagram be lost). An older agent
counts the pause datagrams as bad and carries on.

The client part of this module uses the standard library only and imports nothing else at
import time, so the file can also be copied alone into a training image.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collectors.base import Collected, ProblemLog

logger = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:9477"
"""Where the node agent listens unless ``MINDER_PROBE_ADDR`` says otherwise."""
ADDRESS_ENV = "MINDER_PROBE_ADDR"
RANK_ENV = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
"""Where the global rank is found: torchrun, Slurm, Open MPI, other PMI launchers."""
MAGIC = b"minder2"
"""Protocol tag and version: ``minder2 <rank> <step> <seconds> <busy>`` (ASCII, space
separated; ``busy`` is ``-`` when the step reported none)."""
MAGIC_V1 = b"minder1"
"""The first version, still accepted by the agent: ``minder1 <rank> <seconds>``."""
NO_BUSY = b"-"
PAUSE = b"pause"
"""Second word of a pause datagram: ``minder2 <rank> pause <1|0> <reason>``."""
MAX_REASON = 32
"""Longest pause reason sent (characters; others than letters, digits, ``_.-`` become ``_``)."""
MAX_DATAGRAM = 512
"""Longest datagram the agent reads; a valid one is under 128 bytes."""
MAX_RANK = 2**31 - 1
MAX_STEP = 2**53
"""Largest step number (exact as a float64; windows of float32 hold it exactly to 2**24)."""
_BUSY_SLACK = 1e-9
"""Relative rounding allowed when summed busy blocks come out a hair over the step's time."""


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6addr]:port`` for IPv6) into host and port.

    Raises
    ------
    ValueError
        When ``address`` has no port or the port is not an integer in 0..65535.
    """
    host, sep, port_text = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(
            f"probe address {address!r}: expected 'host:port' with a port in 0..65535, "
            "e.g. '127.0.0.1:9477' or '[::1]:9477'"
        )
    return host, int(port_text)


def _format_address(sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _resolve(host: str, port: int, *, passive: bool = False) -> tuple[int, tuple[str, int]]:
    """``(family, sockaddr)`` for a UDP endpoint; numeric hosts need no resolver round-trip."""
    flags = socket.AI_PASSIVE if passive else 0
    try:
        infos = socket.getaddrinfo(
            host, port, 0, socket.SOCK_DGRAM, 0, flags | socket.AI_NUMERICHOST
        )
    except socket.gaierror:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM, 0, flags)
    family, _, _, _, sockaddr = infos[0]
    return family, (str(sockaddr[0]), int(sockaddr[1]))


def rank_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The process's global rank from the launcher's environment, else 0."""
    env = os.environ if environ is None else environ
    for key in RANK_ENV:
        value = env.get(key, "").strip()
        if value.isascii() and value.isdigit() and int(value) <= MAX_RANK:
            return int(value)
        if value:
            logger.warning("ignoring %s=%r: expected a non-negative integer rank", key, value)
    return 0


class StepTimer:
    """What ``with probe.timer() as t`` yields: set ``t.busy`` (seconds) or ``t.number`` (the
    step's index) inside the block to report them; left None, the busy time is what the
    ``busy()`` blocks of the step added up to (if any) and the number is the next one."""

    __slots__ = ("busy", "number")

    def __init__(self) -> None:
        self.busy: float | None = None
        self.number: int | None = None


class StepProbe:
    """Sends one datagram per training step to the node agent; never blocks, never raises.

    Parameters
    ----------
    address
        ``host:port`` of the agent's :class:`ProbeSource`; default ``$MINDER_PROBE_ADDR`` or
        ``127.0.0.1:9477``. An explicit malformed address raises ``ValueError``; a malformed
        environment value, or one that cannot be resolved, disables the probe (every step is
        counted as dropped) with one warning, because the probe may be created inside the loop.
    rank
        Global rank reported with each step; default ``RANK`` / ``SLURM_PROCID`` / ... or 0.

    Attributes
    ----------
    sent, dropped, ignored
        Datagrams (steps and pause marks) handed to the kernel, datagrams that could not be
        sent, and steps refused: a step time that is not a finite number > 0, a busy time that
        is not finite, negative or longer than the step, or a step number that is not an integer
        in 0..2**53.
    number
        Index of the last step reported (-1 before the first). Every call of :meth:`step`
        counts, refused ones too (the step happened); ``step(..., number=n)`` sets it.
    """

    def __init__(self, address: str | None = None, rank: int | None = None) -> None:
        if rank is not None and (isinstance(rank, bool) or not 0 <= rank <= MAX_RANK):
            raise ValueError(f"probe rank {rank!r}: expected an integer in 0..{MAX_RANK}")
        self.rank = rank_from_env() if rank is None else int(rank)
        self.address = address if address is not None else os.environ.get(ADDRESS_ENV, "")
        self.address = self.address or DEFAULT_ADDRESS
        self.sent = 0
        self.dropped = 0
        self.ignored = 0
        self.number = -1
        self._busy_s = 0.0
        """Busy time the ``busy()`` blocks of the current step added up to."""
        self._busy_seen = False
        """Whether a ``busy()`` block ran in the current step (0 s is then a measurement)."""
        self._busy_depth = 0
        self._pause_depth = 0
        self._prefix = b"%s %d " % (MAGIC, self.rank)
        self._sock: socket.socket | None = None
        try:
            host, port = parse_address(self.address)
        except ValueError:
            if address is not None:
                raise
            logger.warning("%s=%r is malformed; step times are not sent", ADDRESS_ENV, self.address)
            return
        try:
            family, sockaddr = _resolve(host, port)
            sock = socket.socket(family, socket.SOCK_DGRAM)
        except OSError as exc:
            logger.warning("probe address %r unusable (%s); step times not sent", self.address, exc)
            return
        try:
            sock.setblocking(False)
            # Connected UDP: the kernel reports "no listener" (ICMP) on a later send as
            # ECONNREFUSED, so the drops are counted rather than silent.
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            logger.warning("probe address %r unusable (%s); step times not sent", self.address, exc)
            return
        self._sock = sock

    def step(self, seconds: float, busy: float | None = None, number: int | None = None) -> None:
        """Report one step of ``seconds`` (of which ``busy`` outside blocking collectives, by
        default what this step's ``busy()`` blocks added up to, else none); ``number`` is the
        step's index (default: the previous one + 1). Returns at once whatever happens."""
        if busy is None and self._busy_seen:
            busy = self._busy_s
        self._busy_s, self._busy_seen = 0.0, False
        index = self.number + 1
        if number is not None:
            given = _step_number(number)
            if given is None:
                self.number = index
                self.ignored += 1
                return
            index = given
        self.number = index
        value = _finite(seconds)
        if value is None or value <= 0.0:
            self.ignored += 1
            return
        busy_text = NO_BUSY
        if busy is not None:
            busy_value = _finite(busy)
            if busy_value is None or busy_value < 0.0:
                self.ignored += 1
                return
            if busy_value > value:
                if busy_value > value * (1.0 + _BUSY_SLACK):
                    self.ignored += 1
                    return
                busy_value = value  # summed blocks a rounding error over the step
            busy_text = repr(busy_value).encode()
        self._send(b"%s%d %s %s" % (self._prefix, index, repr(value).encode(), busy_text))

    def _send(self, datagram: bytes) -> None:
        sock = self._sock
        if sock is None:
            self.dropped += 1
            return
        try:
            sock.send(datagram)
        except OSError:  # no listener (ECONNREFUSED), buffer full (EAGAIN), closed socket
            self.dropped += 1
        else:
            self.sent += 1

    @contextmanager
    def pause(self, reason: str = "pause") -> Iterator[None]:
        """Say that the loop stops stepping on purpose for the ``with`` block (a checkpoint,
        an evaluation), so that the stop is not taken for a hang. Nested blocks send once;
        never raises into the loop."""
        self._pause_depth += 1
        word = _reason(reason)
        if self._pause_depth == 1:
            self._send(b"%s%s 1 %s" % (self._prefix, PAUSE, word))
        try:
            yield
        finally:
            self._pause_depth -= 1
            if self._pause_depth == 0:
                self._send(b"%s%s 0 %s" % (self._prefix, PAUSE, word))

    @contextmanager
    def timer(self) -> Iterator[StepTimer]:
        """Time the ``with`` block and report it as one step (not when the block raises).

        The step's busy time is what ``busy()`` blocks inside it add up to (none if there are
        none), unless the block sets the yielded :class:`StepTimer`'s ``busy``.
        """
        self._busy_s, self._busy_seen = 0.0, False
        handle = StepTimer()
        start = time.perf_counter()
        yield handle
        self.step(time.perf_counter() - start, busy=handle.busy, number=handle.number)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Count the ``with`` block as busy time of the current step (nested blocks once)."""
        self._busy_depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._busy_depth -= 1
            if self._busy_depth == 0:
                self._busy_s += time.perf_counter() - start
                self._busy_seen = True

    def close(self) -> None:
        """Release the socket; later steps are counted as dropped."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def _reason(value: object) -> bytes:
    """A pause reason as one short ASCII word (``pause`` when empty)."""
    text = "".join(
        c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in str(value)[:MAX_REASON]
    )
    return (text or "pause").encode()


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None."""
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def _step_number(value: object) -> int | None:
    """``value`` as a step index in 0..MAX_STEP (an integral float is accepted), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_STEP else None
    if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_STEP:
        return int(value)
    return None


class _Default:
    """Holder of the probe shared by the module-level :func:`step`, :func:`timer`, :func:`busy`."""

    probe: StepProbe | None = None


def configure(address: str | None = None, rank: int | None = None) -> StepProbe:
    """Replace the probe behind :func:`step` and :func:`timer` (e.g. to set the rank)."""
    previous, _Default.probe = _Default.probe, StepProbe(address, rank)
    if previous is not None:
        previous.close()
    return _Default.probe


def default_probe() -> StepProbe:
    """The probe behind :func:`step`, created from the environment on first use."""
    if _Default.probe is None:
        _Default.probe = StepProbe()
    return _Default.probe


def step(seconds: float, busy: float | None = None, number: int | None = None) -> None:
    """Report one training step with the default probe (never raises); see
    :meth:`StepProbe.step`."""
    probe = _Default.probe
    if probe is None:
        probe = default_probe()
    probe.step(seconds, busy, number)


def timer() -> AbstractContextManager[StepTimer]:
    """Time a ``with`` block as one step with the default probe."""
    return default_probe().timer()


def busy() -> AbstractContextManager[None]:
    """Count a ``with`` block as busy time of the default probe's current step."""
    return default_probe().busy()


def pause(reason: str = "pause") -> AbstractContextManager[None]:
    """Say that the loop is paused on purpose for a ``with`` block (default probe); see
    :meth:`StepProbe.pause`."""
    return default_probe().pause(reason)


# -- agent side ----------------------------------------------------------------------------------


class _RankSteps:
    """One rank's steps received in one interval."""

    __slots__ = ("busy", "busy_steps", "number", "seconds", "steps")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0
        self.busy = 0.0
        self.busy_steps = 0
        self.number: int | None = None


class ProbeSource:
    """Receives the probes' datagrams and reports per rank ``train_step_seconds``,
    ``train_busy_seconds``, ``train_step_number`` and, while a rank is paused,
    ``train_paused_seconds``.

    ``collect`` drains the datagrams queued since the previous call and emits, for each rank
    that sent any (device ``rank<N>``): the mean of its step times; the mean busy time of the
    steps that reported one (none reported: no sample, never 0); and the number of the last
    step received (``minder1`` datagrams carry none). Ranks that sent nothing emit nothing. A
    rank that said it is paused (:meth:`StepProbe.pause`) emits ``train_paused_seconds`` at every
    collect until its pause ends (how long it has been paused), then 0 once; a step from it
    ends the pause as well. A
    socket that cannot be bound is reported once (``bind_failed``) and the source then yields
    nothing; malformed datagrams, and steps whose time is not a finite number > 0 or whose busy
    time is negative or longer than the step, are counted as ``bad_datagram``.

    The port is open to every local process, so a flood must not hold the agent's loop nor
    invent devices: one collect reads at most ``max_drain`` datagrams or for ``max_drain_s``
    seconds, and leaves the rest queued for the next interval (counted as ``drain_limit``); and
    at most ``max_ranks`` distinct ranks are accepted (a rank silent for :attr:`RANK_EXPIRY_S`
    frees its place), the datagrams of further ranks are counted as ``too_many_ranks``.

    Parameters
    ----------
    address
        ``host:port`` to bind; port 0 picks a free port (see :attr:`address`).
    max_drain, max_drain_s
        Most datagrams read, and longest time spent reading them, per collect.
    max_ranks
        Most distinct ranks accepted (a node runs a few; a job never more than its world size).
    """

    name = "probe"
    _RECV_BUFFER = 4 << 20
    """Requested receive buffer: at 1 Hz collection the queue holds a whole interval's steps
    (the kernel caps it at ``net.core.rmem_max``; overflowing datagrams are lost)."""
    MAX_DRAIN = 100_000
    """Default most datagrams read per collect (~30 ms of CPU)."""
    MAX_DRAIN_S = 0.05
    """Default longest time one collect spends reading datagrams."""
    MAX_RANKS = 1024
    """Default most distinct ranks accepted."""
    RANK_EXPIRY_S = 600.0
    """A rank that sent nothing for this long no longer counts against ``max_ranks``."""
    _CHECK_EVERY = 256
    """Datagrams read between two looks at the clock."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        max_drain: int = MAX_DRAIN,
        max_drain_s: float = MAX_DRAIN_S,
        max_ranks: int = MAX_RANKS,
    ) -> None:
        # Imported here so that the training-side client above stays standard-library only.
        from collectors.base import Collected, ProblemLog  # noqa: PLC0415
        from minder.core.errors import ValidationError  # noqa: PLC0415
        from minder.core.metrics import metric_spec  # noqa: PLC0415

        for setting, value in (("max_drain", max_drain), ("max_ranks", max_ranks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"probe {setting} is {value!r}: expected an integer >= 1")
        if not max_drain_s > 0:
            raise ValidationError(f"probe max_drain_s is {max_drain_s!r}: expected seconds > 0")
        self.problems: ProblemLog = ProblemLog(self.name)
        self._collected = Collected
        self._upper = metric_spec("train_step_seconds").upper
        self._max_drain = max_drain
        self._max_drain_s = float(max_drain_s)
        self._max_ranks = max_ranks
        self._ranks: dict[int, float] = {}
        """Accepted ranks -> monotonic time they last sent a step."""
        self._paused: dict[int, float] = {}
        """Paused ranks -> monotonic time their pause began."""
        self._unpaused: set[int] = set()
        """Ranks whose pause ended since the last collect (they emit 0 once)."""
        self._sock: socket.socket | None = None
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        sock: socket.socket | None = None
        try:
            family, sockaddr = _resolve(host, port, passive=True)
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._RECV_BUFFER)
            except OSError:
                logger.debug("cannot enlarge the probe receive buffer; keeping the default")
            sock.bind(sockaddr)
        except OSError as exc:
            if sock is not None:
                sock.close()
            self.problems.report(
                "bind_failed", f"cannot listen for step probes on {address}: {exc}"
            )
            return
        self._sock = sock

    @property
    def address(self) -> str | None:
        """The bound ``host:port`` (the real port when 0 was asked for), or None if unbound."""
        if self._sock is None:
            return None
        return _format_address(self._sock.getsockname())

    def collect(self, now: float) -> Collected:
        """Drain the queued datagrams; emit each rank's mean step and busy time, last step."""
        out = self._collected()
        sock = self._sock
        if sock is None:
            return out
        ranks: dict[int, _RankSteps] = {}
        started = time.monotonic()
        deadline = started + self._max_drain_s
        limited = True
        for read in range(self._max_drain):
            if read % self._CHECK_EVERY == 0 and read and time.monotonic() > deadline:
                break
            try:
                data = sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                limited = False
                break
            except OSError as exc:
                self.problems.report("recv_failed", f"reading step probes failed: {exc}")
                limited = False
                break
            pause = _parse_pause(data)
            if pause is not None:
                if self._accept(pause[0], started):
                    self._pause(*pause, at=time.monotonic())
                continue
            parsed = self._parse(data)
            if parsed is None:
                self.problems.report(
                    "bad_datagram",
                    "expected b'minder2 <rank> <step> <seconds> <busy or ->' (or b'minder1 "
                    f"<rank> <seconds>') with 0 < seconds and 0 <= busy <= seconds, or "
                    f"b'minder2 <rank> pause <1 or 0> <reason>', got {data[:64]!r}",
                )
                continue
            rank, number, seconds, busy = parsed
            steps = ranks.get(rank)
            if steps is None:
                if not self._accept(rank, started):
                    continue
                steps = ranks[rank] = _RankSteps()
                if rank in self._paused:  # stepping again: the pause is over
                    self._pause(rank, False, b"step", at=started)
            steps.seconds += seconds
            steps.steps += 1
            if busy is not None:
                steps.busy += busy
                steps.busy_steps += 1
            if number is not None:
                steps.number = number
        if limited and self._pending(sock):
            self.problems.report(
                "drain_limit",
                f"more than {self._max_drain} step datagrams or {self._max_drain_s:g} s of "
                "reading in one interval; the rest is read at the next",
            )
        for rank in sorted(ranks):
            steps, device = ranks[rank], f"rank{rank}"
            out.add("train_step_seconds", device, steps.seconds / steps.steps)
            if steps.busy_steps:
                # Each busy <= its step, so the mean stays <= the mean step time.
                out.add("train_busy_seconds", device, steps.busy / steps.busy_steps)
            if steps.number is not None:
                out.add("train_step_number", device, float(steps.number))
        clock = time.monotonic()
        for rank in sorted(self._paused.keys() | self._unpaused):
            since = self._paused.get(rank)
            # Paused: how long so far (never 0, which says the pause ended); else 0 once.
            paused_s = 0.0 if since is None else max(clock - since, 1e-3)
            out.add("train_paused_seconds", f"rank{rank}", paused_s)
        self._unpaused.clear()
        return out

    def _pause(self, rank: int, on: bool, reason: bytes, *, at: float) -> None:
        """Rank ``rank`` says its pause began (``on``) or ended."""
        if on:
            if rank not in self._paused:
                self._paused[rank] = at
                logger.debug(
                    "rank %d paused (%s)", rank, reason[:MAX_REASON].decode(errors="replace")
                )
        elif self._paused.pop(rank, None) is not None:
            self._unpaused.add(rank)
            logger.debug("rank %d resumed (%s)", rank, reason[:MAX_REASON].decode(errors="replace"))

    def _accept(self, rank: int, now: float) -> bool:
        """Whether ``rank`` has (or gets) a place among the accepted ranks; marks it seen."""
        if rank not in self._ranks and len(self._ranks) >= self._max_ranks:
            stale = now - self.RANK_EXPIRY_S
            for old in [r for r, seen in self._ranks.items() if seen < stale]:
                del self._ranks[old]
                self._paused.pop(old, None)
                self._unpaused.discard(old)
            if len(self._ranks) >= self._max_ranks:
                self.problems.report(
                    "too_many_ranks",
                    f"step datagram of rank {rank} refused: {self._max_ranks} ranks already "
                    "report to this node",
                )
                return False
        self._ranks[rank] = now
        return True

    @staticmethod
    def _pending(sock: socket.socket) -> bool:
        """Whether a datagram is still queued (peeked, not read)."""
        try:
            sock.recv(1, socket.MSG_PEEK)
        except OSError:  # BlockingIOError: the queue is empty
            return False
        return True

    def _parse(self, data: bytes) -> tuple[int, int | None, float, float | None] | None:
        """``(rank, step number, seconds, busy)`` of a valid datagram, else None."""
        parts = data.split()
        if len(parts) == 3 and parts[0] == MAGIC_V1:
            rank_text, number_text, seconds_text, busy_text = parts[1], None, parts[2], NO_BUSY
        elif len(parts) == 5 and parts[0] == MAGIC:
            rank_text, number_text, seconds_text, busy_text = parts[1:]
        else:
            return None
        if not rank_text.isdigit() or int(rank_text) > MAX_RANK:
            return None
        number: int | None = None
        if number_text is not None:
            if not number_text.isdigit() or int(number_text) > MAX_STEP:
                return None
            number = int(number_text)
        try:
            seconds = float(seconds_text)
            busy = None if busy_text == NO_BUSY else float(busy_text)
        except ValueError:
            return None
        if not 0.0 < seconds <= self._upper:  # NaN fails both comparisons
            return None
        if busy is not None and not 0.0 <= busy <= seconds:
            return None
        return int(rank_text), number, seconds, busy

    def close(self) -> None:
        """Close the socket; later collects yield nothing."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def _parse_pause(data: bytes) -> tuple[int, bool, bytes] | None:
    """``(rank, paused, reason)`` of a pause datagram, else None (not one, or malformed: then
    the step parser refuses it and it is counted)."""
    parts = data.split()
    if len(parts) != 5 or parts[0] != MAGIC or parts[2] != PAUSE or parts[3] not in (b"0", b"1"):
        return None
    if not parts[1].isdigit() or int(parts[1]) > MAX_RANK or len(parts[4]) > MAX_REASON:
        return None
    return int(parts[1]), parts[3] == b"1", parts[4]
