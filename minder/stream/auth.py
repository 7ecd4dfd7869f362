"""The consumer's check of batch signatures (docs/security.md): required or permissive.

:class:`BatchAuthenticator` ties the stateless :class:`~minder.core.signing.Verifier` to a
:class:`~minder.core.signing.ReplayGuard` and to the mode:

- ``required`` (the default of new installs): a batch that is unsigned, badly signed, signed
  with an unknown or another node's key, replayed, or signed outside the time window is
  dead-lettered with its reason before it touches any state, and counted;
- ``permissive`` (migration): the same checks, counted and logged, but the batch is taken.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from enum import StrEnum
from pathlib import Path

from minder.core.signing import (
    AUTH_REASONS,
    AuthError,
    AuthReason,
    ReplayGuard,
    Verified,
    Verifier,
    service_cluster_keys,
    signature_header,
)

logger = logging.getLogger(__name__)

LOG_EVERY_S = 30.0
"""Refused (or, permissive, accepted) unauthenticated batches are logged at most this often."""


class AuthMode(StrEnum):
    REQUIRED = "required"
    PERMISSIVE = "permissive"


class BatchAuthenticator:
    """Verifies each message of a poll; the consumer commits or rolls back its replay marks.

    Parameters
    ----------
    verifier
        The cluster keys and time window.
    mode
        ``required``: :meth:`check` raises :class:`AuthError`; ``permissive``: it counts and
        logs, and lets the batch through.
    """

    def __init__(
        self,
        verifier: Verifier,
        mode: AuthMode = AuthMode.REQUIRED,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.verifier = verifier
        self.mode = AuthMode(mode)
        self.guard = ReplayGuard()
        self.failures: Counter[str] = Counter(dict.fromkeys(AUTH_REASONS, 0))
        """Messages that failed a check, by reason (each message once; both modes)."""
        self.verified_by_kid: Counter[str] = Counter()
        """Verified batches per cluster key id: a rotation retires a key once its count stops
        rising."""
        self._clock = clock
        self._logged_at = -LOG_EVERY_S
        self._since_log: Counter[str] = Counter()
        self._counted: set[Hashable] = set()  # messages counted since the last commit

    @classmethod
    def from_key_file(
        cls,
        path: Path | None,
        mode: str = AuthMode.REQUIRED,
        *,
        max_age_s: float = 3600.0,
        max_skew_s: float = 300.0,
    ) -> BatchAuthenticator | None:
        """From the service's cluster key file (or systemd's ``minder-cluster-keys``
        credential when ``path`` is None).

        Without keys: required mode raises ValidationError (one line naming the settings);
        permissive mode returns None after a warning (nothing can be verified).
        """
        chosen = AuthMode(mode)
        keys = service_cluster_keys(path, required=chosen is AuthMode.REQUIRED)
        if keys is None:
            logger.warning(
                "batch signatures are not checked: permissive mode and no cluster key file "
                "(MINDER_AUTH__KEYS_FILE); anyone who can write to the metrics topic speaks for "
                "every node"
            )
            return None
        verifier = Verifier(keys, max_age_s=max_age_s, max_skew_s=max_skew_s)
        logger.info(
            "batch signatures %s; cluster keys %s",
            "required" if chosen is AuthMode.REQUIRED else "checked (permissive mode)",
            ", ".join(key.kid for key in keys),
        )
        return cls(verifier, chosen)

    def check(
        self,
        headers: Sequence[tuple[str, bytes]] | None,
        payload: bytes,
        key: Hashable = None,
    ) -> Verified | None:
        """The signer of a message, before it is decoded.

        Raises
        ------
        AuthError
            Required mode, and the signature does not hold. Permissive mode returns None
            instead (counted and logged).

        ``key`` (partition and offset) makes a message redelivered before its poll was
        committed count once.
        """
        try:
            return self.verifier.verify(signature_header(headers), payload)
        except AuthError as exc:
            self._failed(exc, key)
            return None

    def check_batch(
        self, verified: Verified | None, node: str, job: str, key: Hashable = None
    ) -> None:
        """After decoding: the batch's node is its signer's, and its seq is new for its job."""
        if verified is None:
            return
        try:
            if verified.node != node:
                raise AuthError(
                    AuthReason.MISATTRIBUTED,
                    f"batch says node {node[:64]!r} but is signed with the key of node "
                    f"{verified.node[:64]!r}",
                )
            self.guard.check(verified, job)
        except AuthError as exc:
            self._failed(exc, key)
            return
        self.verified_by_kid[verified.kid] += 1

    @property
    def verified(self) -> int:
        """Batches whose signature held, all key ids together."""
        return sum(self.verified_by_kid.values())

    def _failed(self, exc: AuthError, key: Hashable = None) -> None:
        """Count and log ``exc`` (once per message ``key``); raise it in required mode."""
        if key is None or key not in self._counted:
            if key is not None:
                self._counted.add(key)
            self._count(exc)
        if self.mode is AuthMode.REQUIRED:
            raise exc

    def _count(self, exc: AuthError) -> None:
        self.failures[exc.reason.value] += 1
        self._since_log[exc.reason.value] += 1
        now = self._clock()
        if now - self._logged_at < LOG_EVERY_S:
            return
        self._logged_at = now
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self._since_log.items()))
        self._since_log.clear()
        logger.warning(
            "unauthenticated batches %s (%s); latest: %s",
            "dead-lettered" if self.mode is AuthMode.REQUIRED else "accepted (permissive mode)",
            counts,
            str(exc)[:300],
        )

    def commit(self) -> None:
        self.guard.commit()
        self._counted.clear()

    def rollback(self) -> None:
        self.guard.rollback()
