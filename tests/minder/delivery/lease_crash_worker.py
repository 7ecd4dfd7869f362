"""A delivery worker in a process of its own, for ``test_delivery_lease.py``: it claims the due
rows of ``webhook:ops`` and hangs sending the first one (its lease renewed by the heartbeat) until
it is killed. It prints ``sending <delivery_id>`` once the send has begun.

Usage: ``python lease_crash_worker.py DATABASE_URL LEASE_S``
"""

from __future__ import annotations

import sys
import time

from minder.delivery.worker import DeliveryWorker
from minder.storage import create_engine_for, session_factory
from minder.storage.outbox import Delivery


class HangingSender:
    destination = "webhook:ops"
    timeout_s = 3600.0

    def send(self, delivery: Delivery) -> None:
        print(f"sending {delivery.delivery_id}", flush=True)
        time.sleep(3600)

    def close(self) -> None:
        pass


def main() -> None:
    url, lease_s = sys.argv[1], float(sys.argv[2])
    sessions = session_factory(create_engine_for(url))
    DeliveryWorker(HangingSender(), sessions, lease_s=lease_s).run_once()


if __name__ == "__main__":
    main()
