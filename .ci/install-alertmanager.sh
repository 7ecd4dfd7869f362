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

BINARY=/usr/bin/prometheus-alertmanager

if [ ! -x "$BINARY" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-alertmanager: need root for apt-get install prometheus-alertmanager" >&2
        exit 2
    fi
    export DEBIAN_FRONTEND=noninteractive
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod 0755 "$policy"
        created_policy=1
    fi
    trap 'if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
    if ! apt-get install -y --no-install-recommends prometheus-alertmanager; then
        apt-get update -qq
        apt-get install -y --no-install-recommends prometheus-alertmanager
    fi
fi

echo "== alertmanager"
"$BINARY" --version 2>&1 | head -n 1
