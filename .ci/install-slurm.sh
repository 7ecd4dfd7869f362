#!/usr/bin/env bash
# Installs Slurm (slurmctld, slurmd, scontrol) and MUNGE for tests/minder/actions: the tests start
# their own one-host cluster from a temporary slurm.conf (tests/minder/actions/slurm_cluster.py)
# and skip, saying so, when these binaries are missing. No service is started or enabled here:
# policy-rc.d refuses service starts for the duration of the install, and the tests never read
# /etc/slurm or /etc/munge.
#
# Usage: .ci/install-slurm.sh   (as root; exits at once when everything is installed)
set -euo pipefail

have_all() {
    local bin
    for bin in slurmctld slurmd scontrol munged mungekey; do
        command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || return 1
    done
}

if have_all; then
    echo "install-slurm: already installed ($(slurmd -V 2>&1 | head -n 1))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-slurm: need root for apt-get install slurm-wlm munge" >&2
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

packages=(slurm-wlm munge)
if ! apt-get install -y --no-install-recommends "${packages[@]}"; then
    apt-get update -qq
    apt-get install -y --no-install-recommends "${packages[@]}"
fi

if ! have_all; then
    echo "install-slurm: installed, but a binary is still missing" >&2
    exit 1
fi
echo "install-slurm: $(slurmd -V 2>&1 | head -n 1), $(munged --version 2>&1 | head -n 1)"
