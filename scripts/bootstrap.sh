#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine, skipping what is
# already there: Debian packages (FUSE 3 and what building pyfuse3 needs, plus
# any extra package names given as arguments), then the virtualenv in .venv
# with the package and its test/dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."

# attr: getfattr/setfattr, which the mount's tests (and users) read xattrs with.
# systemd: systemd-analyze, -sysusers and -tmpfiles check the unit files
# offline (containers often lack it; it need not be running).
# nftables: nft, which the network partition tests drop packets with.
# meson, ninja-build: the libfuse with FUSE passthrough that pyfuse3 is built
# against (scripts/build_pyfuse3.sh); libfuse3-dev stays for other builds.
packages=(fuse3 libfuse3-dev pkg-config gcc python3-dev meson ninja-build attr systemd nftables "$@")
PYTHON=${PYTHON:-python3}
# Debian's own python3 needs python3-venv for `-m venv`; other builds ship ensurepip.
if ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then packages+=(python3-venv); fi

# Spark (the pipeline and its tests) runs on Java 17; the machines ship it.
if ! command -v java >/dev/null; then packages+=(openjdk-17-jre-headless); fi
# javac builds the JVM reader of segments (pipeline/jvm) against pyspark's jars.
if ! command -v javac >/dev/null; then packages+=(openjdk-17-jdk-headless); fi

# Headless Chromium loads the daemon's status page in a test (tests/test_status_page.py).
if ! command -v chromium >/dev/null; then packages+=(chromium); fi

missing=()
for p in "${packages[@]}"; do
    # python3-dev is satisfied by any Python that ships its headers (pyenv builds do).
    if [ "$p" = python3-dev ] && "$PYTHON" -c \
        'import sysconfig,os,sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"],"Python.h")))'; then
        continue
    fi
    if [ "$p" = gcc ] && command -v gcc >/dev/null; then continue; fi
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "bootstrap: installing Debian packages: ${missing[*]}"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# -- Prometheus (promtool and the server), for packaging/monitoring/ ----------
# tests/test_monitoring.py checks the alerting rules and the dashboard with
# /usr/bin/promtool and runs its own /usr/bin/prometheus on a free port. The
# package's service must not run: it would hold port 9090 and scrape nothing
# of ours. Its postinst starts it through invoke-rc.d / deb-systemd-invoke,
# which ask policy-rc.d first: where none is in place, one that refuses every
# start is put there for this install only; the service is disabled after.
if ! dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q 'install ok installed'; then
    echo "bootstrap: installing Debian's prometheus (for promtool; its service stays off)"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        trap '$sudo rm -f "$policy"' EXIT
        printf '#!/bin/sh\n# scripts/bootstrap.sh, during one install: start no service\nexit 101\n' \
            | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus
    if [ -n "$(trap -p EXIT)" ]; then $sudo rm -f "$policy"; trap - EXIT; fi
    if [ -d /run/systemd/system ]; then
        $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    else
        $sudo deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
        $sudo update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv"
    "$PYTHON" -m venv .venv
fi
# pyfuse3 with FUSE passthrough (and the libfuse it needs) before the
# package: its install then finds pyfuse3 3.5.0 in place and keeps it.
scripts/build_pyfuse3.sh .venv
stamp=.venv/.stamp-install
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing the package into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test,dev,pipeline]"
    touch "$stamp"
fi
# The JVM reader's jar (format "segments-jvm"), rebuilt when a source changed.
.venv/bin/python -m pipeline.jvm >/dev/null
# Byte-code for the tree itself (site-packages got theirs from pip): the
# package is installed editable, so without this every process the tests and
# the daemon start (daemons, hosted containers, CLI calls, Spark's Python
# workers) compiles ~220 modules from source when PYTHONDONTWRITEBYTECODE is
# set, or until a first run has written them: 0.35 s of CPU of the 0.9 s an
# `import gateway.daemon` costs. Only stale files are compiled again.
.venv/bin/python -m compileall -q -j 0 gateway fs cache pipeline tests bench >/dev/null
