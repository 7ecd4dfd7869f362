"""A process that starts an embedded broker, for ``test_stream_broker_orphan.py``.

Usage: ``python broker_parent.py PORT [--no-pdeathsig] [--exit]``

The broker is started from a thread that ends at once (the parent-death signal must not follow
that thread). The script prints ``ready <broker pid>``, then sleeps until it is killed, or with
``--exit`` leaves at once without stopping the broker. ``--no-pdeathsig`` starts it without the
parent-death signal (as an older Minder did), so that ``--exit`` leaves it behind.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import minder.stream.broker as broker_module
from minder.stream.broker import EmbeddedBroker


def main() -> None:
    port = int(sys.argv[1])
    if "--no-pdeathsig" in sys.argv:
        broker_module._die_with_parent = lambda: None
    broker = EmbeddedBroker(port=port)
    starter = threading.Thread(target=broker.start)
    starter.start()
    starter.join()
    if not broker.is_running:
        print("failed", flush=True)
        sys.exit(1)
    print(f"ready {broker.pid}", flush=True)
    if "--exit" in sys.argv:
        os._exit(0)  # no clean-up: the broker is left behind
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
