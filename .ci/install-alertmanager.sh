#!/usr/bin/env bash
# Installs Prometheus Alertmanager (Debian package prometheus-alertmanager) for the tests of
# tests/minder/delivery, which start their own /usr/bin/prometheus-alertmanager on a free
# loopback port and skip, saying so, when it is missing.
#
# Idempotent: nothing is done when the binary is there. The package's service is not started:
# a policy-rc.d that refuses service starts is in place for the duration of the install (only
# when no policy is in place already).
#
# Usage: .ci/install-alertmanager.sh
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$0")/apt.sh"

BINARY=/usr/bin/prometheus-alertmanager

if [ ! -x "$BINARY" ]; then
    apt_install_quietly prometheus-alertmanager
fi

echo "== alertmanager"
"$BINARY" --version 2>&1 | head -n 1
