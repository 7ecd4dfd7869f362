"""A minimal receiver of Minder's signed webhooks (docs/webhooks.md): the standard library and
the ``standardwebhooks`` package.

    pip install standardwebhooks
    MINDER_WEBHOOK_SECRET=whsec_... python webhook_receiver.py --port 9000

It verifies each delivery with the Standard Webhooks verifier (signature, and a timestamp within
five minutes), de-duplicates on ``webhook-id`` (Minder delivers at least once), answers 204, and
prints one JSON line per new event. A bad signature gets 401: Minder retries it with backoff until
the secrets match or the delivery's time to live runs out (``GET /api/v1/deliveries?status=pending``
shows it waiting, with the receiver's answer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SEEN_MAX = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description="Receive Minder's signed webhooks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    secret = os.environ.get("MINDER_WEBHOOK_SECRET", "")
    if not secret:
        raise SystemExit("set MINDER_WEBHOOK_SECRET to the endpoint's secret (whsec_...)")
    verifier = Webhook(secret)
    seen: OrderedDict[str, None] = OrderedDict()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                event = verifier.verify(body, dict(self.headers.items()))
            except WebhookVerificationError as exc:
                self.send_response(401)
                self.end_headers()
                self.wfile.write(str(exc).encode())
                return
            delivery_id = self.headers["webhook-id"]
            if delivery_id not in seen:  # at-least-once: a retry repeats the same id
                seen[delivery_id] = None
                if len(seen) > SEEN_MAX:
                    seen.popitem(last=False)
                alert = event["data"].get("alert", {})
                line = {
                    "id": delivery_id,
                    "type": event["type"],
                    "job": alert.get("job"),
                    "machine": alert.get("machine"),
                    "kind": alert.get("kind"),
                    "status": alert.get("status"),
                }
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
