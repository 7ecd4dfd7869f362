"""In-process ``ethtool -S``: a netdev's driver statistics through the SIOCETHTOOL ioctl.

``ethtool -S <netdev>`` asks the kernel three things over ``ioctl(SIOCETHTOOL)`` on any socket: how
many statistics the driver has (``ETHTOOL_GSSET_INFO`` for the ``ETH_SS_STATS`` string set, or
``n_stats`` of ``ETHTOOL_GDRVINFO`` on kernels without it), their names (``ETHTOOL_GSTRINGS``,
32 NUL-padded bytes each) and their u64 values (``ETHTOOL_GSTATS``, in the same order). Doing it
here saves one process per netdev per second; the names are fetched once per interface and again
when the count changes (or after ``names_max_age_s``), so a steady read is two ioctls.

Layouts (``include/uapi/linux/ethtool.h``, native byte order, same on 32- and 64-bit)::

    struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; };
    struct ethtool_drvinfo   { u32 cmd; char driver[32], version[32], fw_version[32],
                               bus_info[32], erom_version[32], reserved2[12];
                               u32 n_priv_flags, n_stats, testinfo_len, eedump_len, regdump_len; };
    struct ethtool_gstrings  { u32 cmd; u32 string_set; u32 len; u8 data[]; };
    struct ethtool_stats     { u32 cmd; u32 n_stats; u64 data[]; };

``struct ifreq`` is the interface name (``IFNAMSIZ`` = 16 bytes) followed by a union whose
``ifr_data`` member points at the command buffer.

Kernels without the ``net/ethtool/ioctl.c`` fix of December 2025
(patch.msgid.link/20251208121901.3203692-1-gal@nvidia.com, also sent to stable) write as many
entries as the driver has *now*, whatever the buffer holds, so a count that grew between the size
query and the read would overrun it: the buffers here keep room for twice the count plus 256.
With the fix, the count sent in ``len`` / ``n_stats`` makes the kernel answer 0 on a mismatch
instead. Either way a count that differs from the one asked for means "the set changed": the
names are fetched again and the read retried.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from types import TracebackType
from typing import NoReturn

__all__ = [
    "ETHTOOL_GDRVINFO",
    "ETHTOOL_GSSET_INFO",
    "ETHTOOL_GSTATS",
    "ETHTOOL_GSTRINGS",
    "ETH_GSTRING_LEN",
    "ETH_SS_STATS",
    "SIOCETHTOOL",
    "EthtoolError",
    "EthtoolNoDevice",
    "EthtoolReader",
    "EthtoolUnsupported",
    "StatNames",
    "read_stats",
]

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16

_REQUEST_NAMES = {
    ETHTOOL_GDRVINFO: "ETHTOOL_GDRVINFO",
    ETHTOOL_GSTRINGS: "ETHTOOL_GSTRINGS",
    ETHTOOL_GSTATS: "ETHTOOL_GSTATS",
    ETHTOOL_GSSET_INFO: "ETHTOOL_GSSET_INFO",
}
# struct ifreq: name, then the ifr_data pointer; padded past the 24-byte union of 64-bit Linux.
_IFREQ = struct.Struct("16sP24x")
_SSET_INFO = struct.Struct("=IIQI")  # one queried set -> one u32 of data
_DRVINFO_SIZE = 196
_DRVINFO_N_STATS = 180  # offset of n_stats: 4 + 5 * 32 + 12 + 4
_GSTRINGS_HEADER = struct.Struct("=III")
_GSTATS_HEADER = struct.Struct("=II")
_U64 = struct.Struct("=Q")
_MAX_STATS = 1 << 20
"""More statistics than any driver has: a count beyond it is garbage, not a buffer to allocate."""

# errnos that say "this interface, driver or kernel does not answer these ioctls", as opposed to
# a device that is gone (ENODEV) or a driver that failed this once (EIO, EBUSY, ETIMEDOUT ...).
_UNSUPPORTED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTTY, errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.EACCES}
)


class EthtoolError(OSError):
    """An ethtool ioctl failed for one interface.

    Attributes
    ----------
    ifname
        The interface asked about.
    request
        The ethtool command that failed (``"ETHTOOL_GSTATS"`` ...).
    errno, strerror
        As for any :class:`OSError`.
    """

    def __init__(self, ifname: str, request: str, err: int, detail: str | None = None) -> None:
        super().__init__(err, detail or os.strerror(err))
        self.ifname = ifname
        self.request = request

    def __str__(self) -> str:
        return f"{self.request} on interface {self.ifname!r}: [Errno {self.errno}] {self.strerror}"


class EthtoolUnsupported(EthtoolError):  # noqa: N818 (the agreed name; reads like an errno)
    """The interface's driver (or this kernel, or a sandbox) gives no statistics by ioctl.

    Raised for EOPNOTSUPP, ENOTTY, ENOSYS, EINVAL, EPERM and EACCES, and with EOPNOTSUPP when the
    driver reports no ``ETH_SS_STATS`` set or an empty one (``ethtool -S`` says "no stats
    available"). It does not go away by retrying.
    """


class EthtoolNoDevice(EthtoolError):  # noqa: N818 (pairs with EthtoolUnsupported)
    """No interface of that name in this network namespace (ENODEV, or ENXIO)."""


def _raise(ifname: str, request: int, exc: OSError) -> NoReturn:
    name = _REQUEST_NAMES.get(request, hex(request))
    err = exc.errno if exc.errno is not None else errno.EIO
    if err in (errno.ENODEV, errno.ENXIO):
        raise EthtoolNoDevice(ifname, name, err) from exc
    if err in _UNSUPPORTED:
        raise EthtoolUnsupported(ifname, name, err) from exc
    raise EthtoolError(ifname, name, err) from exc


@dataclass(slots=True)
class StatNames:
    """The statistic names of one interface, as fetched at ``fetched`` (monotonic seconds)."""

    names: tuple[str, ...]
    fetched: float
    index: dict[str, int] = field(init=False, repr=False)
    """``name -> position``; a name a driver lists twice maps to its last position."""

    def __post_init__(self) -> None:
        self.index = {name: i for i, name in enumerate(self.names)}


class _Buffer:
    """A zeroed, reusable byte buffer whose address the kernel writes through."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self._view = (ctypes.c_char * size).from_buffer(self.data)  # pins the bytearray
        self.address = ctypes.addressof(self._view)

    def __len__(self) -> int:
        return len(self.data)


class EthtoolReader:
    """Reads ``ethtool -S`` statistics of any number of interfaces over one socket.

    Not thread-safe: one reader per thread (the node agent collects from one thread).

    Parameters
    ----------
    names_cache
        ``ifname -> StatNames`` to use and fill; a new dict when None. Share it between readers
        to fetch each interface's names once.
    names_max_age_s
        Fetch an interface's names again after this long even if their count did not change:
        a driver may rename statistics in place (mlx5 lists ``rx_prio<N>_pause`` only for the
        priorities with PFC on, so moving PFC from one priority to another keeps the count).
    """

    def __init__(
        self,
        names_cache: dict[str, StatNames] | None = None,
        *,
        names_max_age_s: float = 60.0,
    ) -> None:
        if not names_max_age_s > 0:
            raise ValueError(f"names_max_age_s {names_max_age_s!r}: expected seconds > 0")
        self.names_cache: dict[str, StatNames] = {} if names_cache is None else names_cache
        self._max_age_s = float(names_max_age_s)
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._small = _Buffer(_DRVINFO_SIZE)  # GSSET_INFO and GDRVINFO answers
        self._stats = _Buffer(_GSTATS_HEADER.size + 8 * 256)
        self._has_sset_info = True

    # -- the ioctls ------------------------------------------------------------------------------

    def _ioctl(self, ifname: bytes, name: str, buffer: _Buffer) -> None:
        if self._sock is None:
            raise ValueError("EthtoolReader is closed")
        request = struct.unpack_from("=I", buffer.data)[0]
        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, _IFREQ.pack(ifname, buffer.address))
        except OSError as exc:
            _raise(name, request, exc)

    def _count(self, ifname: bytes, name: str) -> int:
        """Number of ``ETH_SS_STATS`` statistics the driver has now."""
        small = self._small
        refused: EthtoolUnsupported | None = None
        if self._has_sset_info:
            _SSET_INFO.pack_into(small.data, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0)
            try:
                self._ioctl(ifname, name, small)
            except EthtoolUnsupported as exc:
                if exc.errno != errno.EOPNOTSUPP:
                    raise
                refused = exc
            else:
                _, _, mask, count = _SSET_INFO.unpack_from(small.data)
                if not mask & (1 << ETH_SS_STATS):
                    count = 0
                return self._checked_count(name, count)
        small.data[:] = bytes(len(small))
        struct.pack_into("=I", small.data, 0, ETHTOOL_GDRVINFO)
        try:
            self._ioctl(ifname, name, small)
        except EthtoolError:
            if refused is not None:
                raise refused from None  # the interface refuses both: say what was asked first
            raise
        if refused is not None:
            # GDRVINFO works where GSSET_INFO does not: a kernel before 2.6.34, not a driver.
            self._has_sset_info = False
        return self._checked_count(name, struct.unpack_from("=I", small.data, _DRVINFO_N_STATS)[0])

    @staticmethod
    def _checked_count(name: str, count: int) -> int:
        if count <= 0:
            raise EthtoolUnsupported(
                name, "ETHTOOL_GSSET_INFO", errno.EOPNOTSUPP, "driver reports no statistics"
            )
        if count > _MAX_STATS:
            raise EthtoolError(
                name, "ETHTOOL_GSSET_INFO", errno.EOVERFLOW, f"implausible statistics count {count}"
            )
        return count

    def _fetch_names(self, ifname: bytes, name: str, count: int) -> StatNames | None:
        """The names of ``count`` statistics, or None when the count changed meanwhile."""
        room = _room(count)
        buffer = _Buffer(_GSTRINGS_HEADER.size + ETH_GSTRING_LEN * room)
        _GSTRINGS_HEADER.pack_into(buffer.data, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._ioctl(ifname, name, buffer)
        got = _GSTRINGS_HEADER.unpack_from(buffer.data)[2]
        if got != count:
            return None
        start = _GSTRINGS_HEADER.size
        raw = bytes(buffer.data[start : start + ETH_GSTRING_LEN * count])
        names = tuple(
            raw[i : i + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("utf-8", "replace")
            for i in range(0, len(raw), ETH_GSTRING_LEN)
        )
        return StatNames(names, time.monotonic())

    def _fetch_values(self, ifname: bytes, name: str, count: int) -> bool:
        """Read ``count`` values into the stats buffer; False when the count changed meanwhile."""
        need = _GSTATS_HEADER.size + 8 * _room(count)
        if len(self._stats) < need:
            self._stats = _Buffer(need)
        _GSTATS_HEADER.pack_into(self._stats.data, 0, ETHTOOL_GSTATS, count)
        self._ioctl(ifname, name, self._stats)
        return bool(_GSTATS_HEADER.unpack_from(self._stats.data)[1] == count)

    # -- public ----------------------------------------------------------------------------------

    def stat_names(self, ifname: str) -> StatNames:
        """The current statistic names of ``ifname`` (fetched when absent, stale or resized)."""
        encoded = _encode(ifname)
        for _ in range(3):
            names = self._current_names(encoded, ifname, self._count(encoded, ifname))
            if names is not None:
                return names
        raise EthtoolError(
            ifname, "ETHTOOL_GSTRINGS", errno.EAGAIN, "statistics count keeps changing"
        )

    def _current_names(self, encoded: bytes, ifname: str, count: int) -> StatNames | None:
        cached = self.names_cache.get(ifname)
        if (
            cached is not None
            and len(cached.names) == count
            and time.monotonic() - cached.fetched < self._max_age_s
        ):
            return cached
        names = self._fetch_names(encoded, ifname, count)
        if names is None:
            self.names_cache.pop(ifname, None)
            return None
        self.names_cache[ifname] = names
        return names

    def read_stats(self, ifname: str, only: Collection[str] | None = None) -> dict[str, int]:
        """``name -> value`` of every driver statistic of ``ifname`` (as ``ethtool -S`` shows).

        Parameters
        ----------
        ifname
            Interface name (at most 15 bytes).
        only
            Return just these names (those the driver has), which skips building a dict of
            thousands of entries on an mlx5 port with many channels.

        Raises
        ------
        EthtoolNoDevice
            No such interface.
        EthtoolUnsupported
            The driver or kernel gives no statistics by ioctl.
        EthtoolError
            Any other failure of the driver or the kernel (EIO, EBUSY ...).
        ValueError
            ``ifname`` is not a possible interface name, or the reader is closed.
        """
        encoded = _encode(ifname)
        for _ in range(3):
            count = self._count(encoded, ifname)
            names = self._current_names(encoded, ifname, count)
            if names is None or not self._fetch_values(encoded, ifname, count):
                self.names_cache.pop(ifname, None)
                continue  # the driver resized its set between two ioctls: ask again
            values = self._stats.data
            offset = _GSTATS_HEADER.size
            if only is not None:
                return {
                    n: _U64.unpack_from(values, offset + 8 * names.index[n])[0]
                    for n in only
                    if n in names.index
                }
            numbers = memoryview(values)[offset : offset + 8 * count].cast("Q").tolist()
            return dict(zip(names.names, numbers, strict=True))
        raise EthtoolError(
            ifname, "ETHTOOL_GSTATS", errno.EAGAIN, "statistics count keeps changing"
        )

    def close(self) -> None:
        """Close the socket; the reader cannot be used afterwards."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> EthtoolReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_stats(ifname: str, names_cache: dict[str, StatNames] | None = None) -> dict[str, int]:
    """``ethtool -S <ifname>`` as ``name -> value``, over a socket opened for this call.

    Pass the same ``names_cache`` dict to later calls to skip fetching the names again; use an
    :class:`EthtoolReader` to keep the socket too. Raises as :meth:`EthtoolReader.read_stats`.
    """
    with EthtoolReader(names_cache) as reader:
        return reader.read_stats(ifname)


def _encode(ifname: str) -> bytes:
    encoded = ifname.encode("utf-8", "surrogateescape") if isinstance(ifname, str) else b""
    if not 0 < len(encoded) < IFNAMSIZ or b"\0" in encoded or b"/" in encoded:
        raise ValueError(
            f"interface name {ifname!r}: expected 1 to {IFNAMSIZ - 1} bytes without '/' or NUL"
        )
    return encoded


def _room(count: int) -> int:
    """Entries to allocate for ``count``: slack for a set that grows before the kernel fills it."""
    return 2 * count + 256
