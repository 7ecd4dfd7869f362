"""Signed node batches: who may speak for a node (docs/security.md).

**Scheme.** HMAC-SHA256 with a per-node key derived from a cluster key:

    node_key = HMAC-SHA256(cluster_secret, "minder-node-key-v1\\n" + node)
    mac      = HMAC-SHA256(node_key, "minder-batch-v1\\n" kid "\\n" len(node) ":" node
                                     "\\n" seq "\\n" + payload)

and the Kafka header ``minder-sig: v1;<kid>;<node>;<seq>;<base64url mac>``.

Why HMAC rather than Ed25519: the service verifies every batch of every node (10,000 nodes at
1 Hz is 10,000 verifications a second on one worker); an HMAC over a few kilobytes costs a few
microseconds, an Ed25519 verification some 50-100. Deriving each node's key from one cluster
key means the service keeps one secret per key id instead of a key database, and a node's key
reveals nothing of another's (HMAC is a pseudo-random function). What HMAC gives up: whoever
holds the cluster key (the service, the operator who provisions) can sign for any node; an
agent holds only its own node's key.

**Replay.** ``seq`` is the signing time in nanoseconds since the epoch, made strictly increasing
by each :class:`Signer`. The service keeps, per node, the highest ``seq`` it accepted and takes
only larger ones (:class:`ReplayGuard`), and refuses a ``seq`` outside a window around its
clock (``max_age_s`` behind, ``max_skew_s`` ahead), which bounds what a captured batch can do
after the service forgot its state (a restart).

**Rotation.** Key ids (``kid``) name cluster keys. The service accepts every key of its key
file, so a new key is added, node keys derived from it are handed out, and the old key is
retired once no node signs with it: no gap (``minder keys``).

Standard library only: the node agent loads this without numpy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from minder.core.errors import MinderError, ValidationError

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "minder-sig"
"""The Kafka header that carries a batch's signature."""
SCHEME = "v1"
_SCHEME_BYTES = SCHEME.encode()
SECRET_BYTES = 32
"""Length of a cluster secret (and of every derived node key)."""
MAX_NODE_BYTES = 256
CLOCK_STEP_NS = 60 * 10**9
"""A signer whose clock went back more than this restarts its sequence from the new time."""
MAX_HEADER_BYTES = 512
_KID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_BAD_NODE = re.compile(r"[;\s\x00-\x1f\x7f]")
_NODE_KEY_LABEL = b"minder-node-key-v1\n"
_BATCH_LABEL = b"minder-batch-v1\n"
CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
"""Where systemd's ``LoadCredential=`` puts credentials for the unit."""
CLUSTER_KEYS_CREDENTIAL = "minder-cluster-keys"
NODE_KEY_CREDENTIAL = "minder-node-key"


class AuthReason(StrEnum):
    """Why a batch was not taken as its node's word (the reason classes of dead letters and of
    ``minder_batches_unauthenticated_total``)."""

    UNSIGNED = "unsigned"
    """No ``minder-sig`` header."""
    MALFORMED = "malformed_signature"
    """A header that does not parse."""
    UNKNOWN_KEY = "unknown_key"
    """Signed with a key id the service does not hold (retired, or never issued)."""
    BAD_SIGNATURE = "bad_signature"
    """The MAC does not match: a wrong key, or a payload changed on the way."""
    MISATTRIBUTED = "misattributed"
    """A valid signature of one node on a batch that says it comes from another."""
    REPLAYED = "replayed"
    """A sequence number not above the node's highest accepted one."""
    OUTSIDE_WINDOW = "outside_window"
    """Signed too long ago, or too far in the future, for this service's clock."""


AUTH_REASONS: tuple[str, ...] = tuple(reason.value for reason in AuthReason)


class AuthError(MinderError):
    """A batch whose signature does not hold; ``reason`` is its :class:`AuthReason`."""

    def __init__(self, reason: AuthReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class KeyFileError(ValidationError):
    """A key file cannot be read or does not follow its format (never shows a secret)."""


# -- keys -----------------------------------------------------------------------------------


def check_kid(kid: str) -> str:
    """``kid`` when it is a valid key id (1-64 of ``A-Za-z0-9._-``); else ValidationError."""
    if not _KID.match(kid):
        raise ValidationError(
            f"key id {kid[:80]!r}: expected 1-64 of letters, digits, '.', '_', '-'"
        )
    return kid


def check_node(node: str) -> bytes:
    """The UTF-8 bytes of a node name that can be signed for; else ValidationError."""
    raw = node.encode("utf-8", errors="surrogatepass")
    if not raw or len(raw) > MAX_NODE_BYTES or _BAD_NODE.search(node):
        raise ValidationError(
            f"node {node[:80]!r}: expected 1-{MAX_NODE_BYTES} bytes without ';', spaces or "
            "control characters"
        )
    return raw


@dataclass(frozen=True, slots=True)
class ClusterKey:
    """One cluster key: its id and its secret."""

    kid: str
    secret: bytes

    def __repr__(self) -> str:  # never a secret in a log or a traceback
        return f"ClusterKey(kid={self.kid!r})"

    @classmethod
    def generate(cls, kid: str | None = None) -> ClusterKey:
        """A new random key; its id defaults to the UTC time (``k20261128T1642Z``)."""
        kid = kid or time.strftime("k%Y%m%dT%H%M%SZ", time.gmtime())
        return cls(check_kid(kid), secrets.token_bytes(SECRET_BYTES))

    def node_key(self, node: str) -> NodeKey:
        """The key of ``node`` under this cluster key."""
        raw = check_node(node)
        secret = hmac.new(self.secret, _NODE_KEY_LABEL + raw, hashlib.sha256).digest()
        return NodeKey(self.kid, node, secret)


@dataclass(frozen=True, slots=True)
class NodeKey:
    """A node's signing key: the cluster key id it derives from, the node, the secret."""

    kid: str
    node: str
    secret: bytes

    def __repr__(self) -> str:
        return f"NodeKey(kid={self.kid!r}, node={self.node!r})"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def format_cluster_keys(keys: Sequence[ClusterKey]) -> str:
    """The text of a cluster key file: one ``<kid> <secret>`` line per key, newest last."""
    lines = [
        "# Minder cluster keys: the service accepts batches signed with any of them;",
        "# node keys are derived from the last one. Keep this file secret (mode 0600).",
    ]
    lines += [f"{key.kid} {_b64(key.secret)}" for key in keys]
    return "\n".join(lines) + "\n"


def format_node_key(key: NodeKey, *, comment: bool = True) -> str:
    """The text of a node key file: one ``<kid> <node> <secret>`` line (after a comment line
    unless ``comment`` is false: a Kubernetes Secret holds thousands of them)."""
    line = f"{key.kid} {key.node} {_b64(key.secret)}\n"
    if not comment:
        return line
    return "# Minder node key: this node's agent signs its batches with it (mode 0600).\n" + line


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(
            f"key file {str(path)[:200]!r} cannot be read: {exc.__class__.__name__}"
        ) from None
    # Group read is how Kubernetes lets a pod's fsGroup read a mounted Secret (mode 0440).
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        logger.warning(
            "key file %s can be read or written by others (mode %o): expected 0600, 0400 or 0440",
            str(path)[:200],
            stat.S_IMODE(mode),
        )
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            rows.append((number, stripped.split()))
    return rows


def _line_error(path: Path, number: int, problem: str) -> KeyFileError:
    return KeyFileError(f"{str(path)[:200]} line {number}: {problem}")


def _fields(path: Path, number: int, fields: list[str], expected: str) -> tuple[str, ...]:
    """The fields of a key line: as many as ``expected`` names, a valid key id first."""
    if len(fields) != len(expected.split()):
        raise _line_error(path, number, f"{len(fields)} fields, expected '{expected}'")
    if not _KID.match(fields[0]):
        raise _line_error(path, number, f"key id {fields[0][:80]!r} is invalid")
    return tuple(fields)


def _secret(path: Path, number: int, text: str) -> bytes:
    try:
        raw = _unb64(text)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != SECRET_BYTES:
        raise _line_error(
            path, number, f"the secret is not {SECRET_BYTES} bytes of base64url (value not shown)"
        )
    return raw


def load_cluster_keys(path: Path) -> list[ClusterKey]:
    """Every key of a cluster key file, in file order (newest last).

    Raises
    ------
    KeyFileError
        Unreadable, empty, a line that is not ``<kid> <secret>``, a repeated key id.
    """
    keys: list[ClusterKey] = []
    for number, fields in _lines(path):
        kid, secret = _fields(path, number, fields, "<kid> <secret>")
        if any(key.kid == kid for key in keys):
            raise _line_error(path, number, f"key id {kid!r} appears twice")
        keys.append(ClusterKey(kid, _secret(path, number, secret)))
    if not keys:
        raise KeyFileError(
            f"key file {str(path)[:200]!r} holds no key: expected '<kid> <secret>' lines"
        )
    return keys


def load_node_key(path: Path) -> NodeKey:
    """The newest (last) key of a node key file.

    Raises
    ------
    KeyFileError
        Unreadable, empty, or a line that is not ``<kid> <node> <secret>``.
    """
    key: NodeKey | None = None
    for number, fields in _lines(path):
        kid, node, secret = _fields(path, number, fields, "<kid> <node> <secret>")
        try:
            check_node(node)
        except ValidationError as exc:
            raise _line_error(path, number, str(exc)) from None
        key = NodeKey(kid, node, _secret(path, number, secret))
    if key is None:
        raise KeyFileError(
            f"key file {str(path)[:200]!r} holds no key: expected a '<kid> <node> <secret>' line"
        )
    return key


def credential_path(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """``$CREDENTIALS_DIRECTORY/<name>`` when systemd provided it (``LoadCredential=``)."""
    directory = (os.environ if environ is None else environ).get(CREDENTIALS_DIRECTORY)
    if not directory:
        return None
    path = Path(directory) / name
    return path if path.is_file() else None


def write_secret_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (created 0600, replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# -- signing --------------------------------------------------------------------------------


def _mac(secret: bytes, kid: str, node: bytes, seq: int, payload: bytes) -> bytes:
    prefix = _BATCH_LABEL + f"{kid}\n{len(node)}:".encode() + node + f"\n{seq}\n".encode()
    # one C call (OpenSSL's one-shot HMAC); copying a batch of a few KiB costs less than the
    # Python-level HMAC object
    return hmac.digest(secret, prefix + payload, "sha256")


class Signer:
    """Signs one node's batches (the agent holds one, from its node key file).

    ``seq`` is the clock in nanoseconds, strictly increasing across calls (thread-safe), so a
    re-signed resend is never taken for a replay.
    """

    def __init__(self, key: NodeKey, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.key = key
        self._node = check_node(key.node)
        self._clock_ns = clock_ns
        self._last = 0
        self._lock = threading.Lock()

    @property
    def node(self) -> str:
        return self.key.node

    def next_seq(self) -> int:
        with self._lock:
            now = self._clock_ns()
            if self._last - now > CLOCK_STEP_NS:
                # The clock stepped back (NTP corrected a clock that ran ahead): following the
                # old one would date every batch outside the service's window until it caught up.
                step_s = (self._last - now) / 1e9
                logger.warning(
                    "the clock stepped back %.0f s: signing from the new time (the service may "
                    "refuse up to %.0f s of batches of this node as replays)",
                    step_s,
                    step_s,
                )
                self._last = now
            else:
                self._last = max(now, self._last + 1)
            return self._last

    def header(self, payload: bytes) -> tuple[str, bytes]:
        """The ``minder-sig`` header of ``payload``."""
        seq = self.next_seq()
        mac = _mac(self.key.secret, self.key.kid, self._node, seq, payload)
        value = f"{SCHEME};{self.key.kid};{self.key.node};{seq};{_b64(mac)}"
        return SIGNATURE_HEADER, value.encode()


class FleetSigner:
    """Signs for any node with the cluster key (the simulator, ``minder demo``, benchmarks):
    what every agent of a fleet would do, each with its own derived key."""

    def __init__(self, key: ClusterKey, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.key = key
        self._clock_ns = clock_ns
        self._signers: dict[str, Signer] = {}
        self._lock = threading.Lock()

    def signer(self, node: str) -> Signer:
        with self._lock:
            signer = self._signers.get(node)
            if signer is None:
                signer = Signer(self.key.node_key(node), self._clock_ns)
                self._signers[node] = signer
            return signer

    def header(self, node: str, payload: bytes) -> tuple[str, bytes]:
        return self.signer(node).header(payload)


# -- verifying ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verified:
    """What a valid signature proves: ``node`` signed this payload with key ``kid`` at ``seq``."""

    node: str
    kid: str
    seq: int


def signature_header(headers: Iterable[tuple[str, bytes]] | None) -> bytes | None:
    """The value of the ``minder-sig`` header, if any (the first one)."""
    for name, value in headers or ():
        if name == SIGNATURE_HEADER:
            return value
    return None


def _shown(raw: bytes | str) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return repr(text[:64] + ("..." if len(text) > 64 else ""))


class Verifier:
    """Checks ``minder-sig`` headers against the cluster keys (the service holds one).

    Stateless apart from a bounded cache of derived node keys: replay is the
    :class:`ReplayGuard`'s, misattribution the caller's (it compares :attr:`Verified.node` with
    the decoded batch's node).
    """

    def __init__(
        self,
        keys: Sequence[ClusterKey],
        *,
        max_age_s: float = 3600.0,
        max_skew_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        cache_size: int = 200_000,
    ) -> None:
        if not keys:
            raise ValidationError("no cluster key: expected at least one to verify batches with")
        self.keys = {key.kid: key for key in keys}
        self.max_age_s = max_age_s
        self.max_skew_s = max_skew_s
        self._clock = clock
        self._cache: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._cache_size = cache_size

    def _node_secret(self, kid: str, node: str) -> tuple[bytes, bool]:
        """The node's key, and whether it came from the cache (a derived key is cached only
        once a signature made with it held, so forged node names cannot churn the cache)."""
        cached = self._cache.get((kid, node))
        if cached is not None:
            return cached, True
        return self.keys[kid].node_key(node).secret, False

    @property
    def cached_node_keys(self) -> int:
        """Derived node keys kept (only those whose signature held once)."""
        return len(self._cache)

    def _remember(self, kid: str, node: str, secret: bytes) -> None:
        self._cache[(kid, node)] = secret
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def verify(self, header: bytes | None, payload: bytes) -> Verified:
        """The signer of ``payload``.

        Raises
        ------
        AuthError
            Unsigned, malformed, unknown key id, bad MAC, or signed outside the time window.
        """
        if header is None:
            raise AuthError(AuthReason.UNSIGNED, "batch has no minder-sig header")
        if len(header) > MAX_HEADER_BYTES:
            raise AuthError(
                AuthReason.MALFORMED,
                f"minder-sig header of {len(header)} bytes: expected at most {MAX_HEADER_BYTES}",
            )
        parts = header.split(b";")
        if len(parts) < 5 or parts[0] != _SCHEME_BYTES:
            raise AuthError(
                AuthReason.MALFORMED,
                f"minder-sig {_shown(header)}: expected 'v1;<kid>;<node>;<seq>;<mac>'",
            )
        seq_raw, mac_raw = parts[-2], parts[-1]
        node_raw = parts[2] if len(parts) == 5 else b";".join(parts[2:-2])
        if not seq_raw.isdigit() or len(seq_raw) > 20:
            raise AuthError(
                AuthReason.MALFORMED, f"minder-sig seq {_shown(seq_raw)}: expected digits"
            )
        try:
            kid = parts[1].decode("ascii")
            node = node_raw.decode("utf-8")
            check_node(node)
        except (UnicodeDecodeError, ValidationError) as exc:
            raise AuthError(AuthReason.MALFORMED, f"minder-sig: {exc}"[:300]) from None
        if kid not in self.keys:
            raise AuthError(
                AuthReason.UNKNOWN_KEY,
                f"batch of node {_shown(node)} signed with key id {_shown(kid)}: expected one of "
                f"{', '.join(sorted(self.keys))[:200]}",
            )
        seq = int(seq_raw)
        secret, cached = self._node_secret(kid, node)
        expected = _mac(secret, kid, node_raw, seq, payload)
        if not hmac.compare_digest(base64.urlsafe_b64encode(expected).rstrip(b"="), mac_raw):
            raise AuthError(
                AuthReason.BAD_SIGNATURE,
                f"batch of node {_shown(node)}: signature does not match (key {kid})",
            )
        if not cached:
            self._remember(kid, node, secret)
        signed_at = seq / 1e9
        now = self._clock()
        if signed_at > now + self.max_skew_s or signed_at < now - self.max_age_s:
            raise AuthError(
                AuthReason.OUTSIDE_WINDOW,
                f"batch of node {_shown(node)} signed at {signed_at:.0f}, {now - signed_at:+.0f} s "
                f"from this clock: expected within {self.max_age_s:g} s behind and "
                f"{self.max_skew_s:g} s ahead",
            )
        return Verified(node, kid, seq)


class ReplayGuard:
    """The highest accepted ``seq`` per job and node, with the consumer's commit semantics.

    Per job and node, not per node: a node's batches are keyed (partitioned) by job, so when a
    node moves from one job to the next, the old job's last batches and the new job's first
    may be consumed in any order. A replay cannot move a batch to another job: the job is in
    the signed payload.

    :meth:`check` compares against what was committed and what this poll took already;
    :meth:`commit` keeps the poll's marks once its offsets are committed, :meth:`rollback`
    drops them when the poll is redelivered (a redelivery is not a replay).
    """

    def __init__(self, max_nodes: int = 500_000) -> None:
        self._high: OrderedDict[tuple[bytes, str], int] = OrderedDict()
        self._pending: dict[tuple[bytes, str], int] = {}
        self._max_nodes = max_nodes

    def check(self, verified: Verified, job: str) -> None:
        """Take ``verified`` (a batch of ``job``) into this poll, or raise AuthError
        (replayed)."""
        # A digest of the job id, not the id: a node key holder picks job ids of any length.
        key = (
            hashlib.blake2b(job.encode(errors="replace"), digest_size=16).digest(),
            verified.node,
        )
        high = max(self._pending.get(key, 0), self._high.get(key, 0))
        if verified.seq <= high:
            raise AuthError(
                AuthReason.REPLAYED,
                f"batch of node {_shown(verified.node)} in job {_shown(job)} has seq "
                f"{verified.seq}, not above {high} already accepted: a replay or a duplicate",
            )
        self._pending[key] = verified.seq

    def commit(self) -> None:
        for key, seq in self._pending.items():
            self._high[key] = seq
            self._high.move_to_end(key)
        self._pending.clear()
        while len(self._high) > self._max_nodes:
            self._high.popitem(last=False)

    def rollback(self) -> None:
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._high)


def node_signer(path: Path | None, node: str) -> Signer | None:
    """The agent's signer: its key file (or the systemd credential ``minder-node-key`` when
    ``path`` is None), which must be this node's. None when there is no key at all.

    Raises
    ------
    ValidationError
        The file cannot be read or parsed (:class:`KeyFileError`), or it holds another node's
        key.
    """
    path = path or credential_path(NODE_KEY_CREDENTIAL)
    if path is None:
        return None
    key = load_node_key(path)
    if key.node != node:
        raise ValidationError(
            f"key file {str(path)[:200]} is node {key.node[:80]!r}'s but this agent is node "
            f"{node[:80]!r}: expected the key made for it (`minder keys node --node {node[:80]}`)"
        )
    return Signer(key)


# -- key management (``minder keys``) -------------------------------------------------------


def init_cluster_keys(path: Path, kid: str | None = None, *, force: bool = False) -> ClusterKey:
    """Create a cluster key file holding one new key; refuses to replace one unless ``force``."""
    if path.exists() and not force:
        raise ValidationError(
            f"key file {str(path)[:200]} exists: expected a new path, `minder keys rotate` to "
            "add a key to it, or --force to replace it (every node key made from it stops working)"
        )
    key = ClusterKey.generate(kid)
    write_secret_file(path, format_cluster_keys([key]))
    return key


def rotate_cluster_keys(path: Path, kid: str | None = None) -> ClusterKey:
    """Add a new key to a cluster key file (newest last: node keys are made from it from now
    on); the service keeps accepting the older ones until they are retired."""
    keys = load_cluster_keys(path)
    key = ClusterKey.generate(kid)
    if any(old.kid == key.kid for old in keys):
        raise ValidationError(
            f"key id {key.kid!r} is already in {str(path)[:200]}: expected a new one"
        )
    write_secret_file(path, format_cluster_keys([*keys, key]))
    return key


def retire_cluster_key(path: Path, kid: str) -> list[ClusterKey]:
    """Remove key ``kid`` from a cluster key file; the keys left. The last key is never removed."""
    keys = load_cluster_keys(path)
    left = [key for key in keys if key.kid != kid]
    if len(left) == len(keys):
        raise ValidationError(
            f"key id {kid[:80]!r} is not in {str(path)[:200]}: expected one of "
            f"{', '.join(key.kid for key in keys)[:200]}"
        )
    if not left:
        raise ValidationError(
            f"key id {kid!r} is the only key of {str(path)[:200]}: rotate first, then retire it"
        )
    write_secret_file(path, format_cluster_keys(left))
    return left


def pick_cluster_key(keys: Sequence[ClusterKey], kid: str | None = None) -> ClusterKey:
    """Key ``kid``, or the newest (last) one."""
    if kid is None:
        return keys[-1]
    for key in keys:
        if key.kid == kid:
            return key
    raise ValidationError(
        f"key id {kid[:80]!r}: expected one of {', '.join(key.kid for key in keys)[:200]}"
    )


def node_key_file_name(node: str) -> str:
    """The file name of ``node``'s key in a directory of node keys (``<node>.key``)."""
    check_node(node)
    if node in (".", "..") or "/" in node:
        raise ValidationError(f"node {node[:80]!r}: expected a name usable as a file name")
    return f"{node}.key"


def write_node_keys(key: ClusterKey, nodes: Iterable[str], directory: Path) -> list[Path]:
    """One key file per node in ``directory`` (``<node>.key``, mode 0600)."""
    written = []
    for node in nodes:
        path = directory / node_key_file_name(node)
        write_secret_file(path, format_node_key(key.node_key(node)))
        written.append(path)
    return written


def service_cluster_keys(path: Path | None, *, required: bool) -> list[ClusterKey] | None:
    """The service's cluster keys: ``path``, else systemd's ``minder-cluster-keys`` credential.

    Raises
    ------
    ValidationError
        Required and no key file (one line naming the settings), or a bad key file. Permissive
        without keys returns None.
    """
    path = path or credential_path(CLUSTER_KEYS_CREDENTIAL)
    if path is not None:
        return load_cluster_keys(path)
    if required:
        raise ValidationError(
            "batch signatures are required (MINDER_AUTH__MODE=required, the default) but no "
            "cluster key file is set: expected MINDER_AUTH__KEYS_FILE (create one with "
            "`minder keys init`), a 'minder-cluster-keys' systemd credential, or "
            "MINDER_AUTH__MODE=permissive while agents are migrated"
        )
    return None
