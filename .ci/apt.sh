# Sourced by the .ci/install-*.sh scripts: apt_install_quietly PACKAGE...
#
# Installs Debian packages as root without starting their services: a policy-rc.d that refuses
# service starts is in place for the duration of the install (only when no policy is in place
# already, and removed afterwards). Tries without `apt-get update` first, then with it.
apt_install_quietly() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "need root for apt-get install $*" >&2
        return 2
    fi
    export DEBIAN_FRONTEND=noninteractive
    local policy=/usr/sbin/policy-rc.d created=0 status=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod 0755 "$policy"
        created=1
    fi
    if ! apt-get install -y --no-install-recommends "$@"; then
        apt-get update -qq && apt-get install -y --no-install-recommends "$@" || status=$?
    fi
    if [ "$created" = 1 ]; then
        rm -f "$policy"
    fi
    return "$status"
}
