#!/usr/bin/env bash
# Installs Slurm (slurmctld, slurmd, scontrol, and the job clients sbatch, srun, squeue, scancel
# of slurm-client, which slurm-wlm depends on) and MUNGE for tests/minder/actions: the tests start
# their own one-host cluster from a temporary slurm.conf (tests/minder/actions/slurm_cluster.py)
# and skip, saying so, when these binaries are missing. No service is started or enabled here:
# policy-rc.d refuses service starts for the duration of the install, and the tests never read
# /etc/slurm or /etc/munge.
#
# Usage: .ci/install-slurm.sh   (as root; exits at once when everything is installed)
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$0")/apt.sh"

have_all() {
    local bin
    for bin in slurmctld slurmd scontrol sbatch srun squeue scancel munged mungekey; do
        command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || return 1
    done
}

if have_all; then
    echo "install-slurm: already installed ($(slurmd -V 2>&1 | head -n 1))"
    exit 0
fi

apt_install_quietly slurm-wlm munge

if ! have_all; then
    echo "install-slurm: installed, but a binary is still missing" >&2
    exit 1
fi
echo "install-slurm: $(slurmd -V 2>&1 | head -n 1), $(munged --version 2>&1 | head -n 1)"
