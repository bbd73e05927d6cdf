#!/usr/bin/env bash
# Builds dist/segment-gateway_<version>_<arch>.deb (`make deb`):
#
#   /opt/segment-gateway/            a venv made with Debian's python3, holding
#                                    the package and its runtime dependencies
#   /opt/segment-gateway/opt/libfuse/lib/libfuse3.so.4
#                                    libfuse 3.17 for pyfuse3's FUSE passthrough
#   /usr/bin/segment-gateway         -> /opt/segment-gateway/bin/segment-gateway
#   /usr/lib/systemd/system/segment-gateway.service
#   /usr/lib/tmpfiles.d/segment-gateway.conf, /usr/lib/sysusers.d/segment-gateway.conf
#   /etc/segment-gateway/gateway.toml   (a conffile)
#   /usr/share/segment-gateway/      alerts.yml, dashboard.json (packaging/monitoring)
#   /usr/share/doc/segment-gateway/     OPERATIONS.md, CONFIG.md, copyright
#
# The venv is built in a staging root under build/deb and then made
# relocatable to /opt/segment-gateway: pip writes the staging path into
# script shebangs, bin/activate* and pyvenv.cfg, and byte-code is compiled
# with the final paths. Nothing is installed on this machine.
#
# Environment: DEB_PYTHON (default /usr/bin/python3) is the interpreter the
# package is built for and depends on; DEB_COMPRESS (default zstd) is
# dpkg-deb's compressor; DEB_BUILD_DIR (default build/deb) and DEB_DIST_DIR
# (default dist) are where it stages and where the .deb goes.
set -euo pipefail
cd "$(dirname "$0")/.."
# Whatever the caller's umask, the files must be readable by the daemon's user.
umask 022

PREFIX=/opt/segment-gateway
PYTHON=${DEB_PYTHON:-/usr/bin/python3}
COMPRESS=${DEB_COMPRESS:-zstd}
BUILD=$(realpath -m "${DEB_BUILD_DIR:-build/deb}")
DIST=${DEB_DIST_DIR:-dist}
STAGE=$BUILD/root
VENV=$STAGE$PREFIX

die() {
    echo "build_deb: $*" >&2
    exit 1
}

# -- build dependencies -------------------------------------------------------------
# pip (from .venv) installs into the new venv and builds pyfuse3 there against
# libfuse3-dev, so that needs the headers of *this* Python, not the one .venv
# was made with.
[ -x .venv/bin/python ] || die ".venv is missing: run 'make install' first"
[ -x "$PYTHON" ] || scripts/bootstrap.sh python3
py=$("$PYTHON" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than 3.11"
# Only when missing: bootstrap also refreshes .venv, which must not happen
# under a test run that is using it.
if ! "$PYTHON" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    scripts/bootstrap.sh "$py-dev"
fi

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gateway/__init__.py)
[ -n "$version" ] || die "no __version__ in gateway/__init__.py"
# PEP 440 pre-releases (1.0rc1, 1.0.dev2) must sort before the release in dpkg.
debversion=$(sed -E 's/\.?(a|b|rc|dev)([0-9]+)/~\1\2/g' <<<"$version")
arch=$(dpkg --print-architecture)
deb=$DIST/segment-gateway_${debversion}_${arch}.deb

rm -rf "$BUILD"
mkdir -p "$STAGE" "$DIST"

# -- the venv --------------------------------------------------------------------
# Built from a copy of the working tree (tracked and unignored files), so
# setuptools' scratch in ./build can never put stale modules in the wheel.
echo "build_deb: building the venv for $PREFIX with $PYTHON"
mkdir -p "$BUILD/src"
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf - | tar -C "$BUILD/src" -xf -
# The JVM reader's jar (format "segments-jvm"), compiled here against .venv's
# pyspark jars: built, not tracked, so copied in by name.
.venv/bin/python -m pipeline.jvm >/dev/null || die "the segments-jvm jar did not build"
cp pipeline/jvm/segments-jvm.jar "$BUILD/src/pipeline/jvm/"

# No pip inside: nothing on the node should change this venv but a new .deb.
# Made with the real interpreter (python3.X), not the python3 alias: the venv
# is bound to one minor version, which the Depends line names.
"$(readlink -f "$PYTHON")" -m venv --without-pip --prompt segment-gateway "$VENV"
# pyfuse3 with FUSE passthrough first, and the libfuse 3.17 it needs as
# $PREFIX/opt/libfuse/lib/libfuse3.so.4 (found through an $ORIGIN-relative
# rpath, so it works on a host without it); the package's install below then
# finds pyfuse3 3.5.0 in place and keeps it.
scripts/build_pyfuse3.sh "$VENV" .venv/bin/python || die "pyfuse3 with passthrough did not build"
rm -f "$VENV/.stamp-pyfuse3-passthrough"
# pip runs under the new venv's interpreter (--python), so wheels are chosen
# and pyfuse3 is compiled for it. Its cache keeps rebuilds fast.
.venv/bin/python -m pip --python "$VENV/bin/python" install \
    --quiet --no-compile --no-warn-script-location --disable-pip-version-check \
    "$BUILD/src"

# Make it relocatable to $PREFIX.
site=$(echo "$VENV"/lib/python3*/site-packages)
rm -f "$site"/segment_gateway-*.dist-info/direct_url.json # names the build directory
for f in "$VENV"/bin/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    if head -c 2 "$f" | grep -q '^#!'; then
        sed -i "1s|^#!$VENV/|#!$PREFIX/|" "$f"
    fi
done
sed -i "s|$VENV|$PREFIX|g" "$VENV"/bin/activate* "$VENV/pyvenv.cfg"
if left=$(grep -rIl --exclude-dir=__pycache__ -e "$STAGE" "$VENV"); then
    die "the staging path is still written in: $left"
fi
# Byte-code compiled now, with the installed paths in it: the daemon's user
# cannot write to /opt, so every start would compile everything again.
"$PYTHON" -m compileall -q -j 0 -s "$STAGE" -p / "$site" >/dev/null ||
    die "compileall failed"

# -- the manual page ----------------------------------------------------------------
# segment-gateway(1) at /usr/share/man/man1, generated from the command's
# argparse definitions (scripts/gen_manpage.sh; argparse-manpage from .venv).
scripts/gen_manpage.sh "$BUILD/segment-gateway.1" || die "the manual page did not build"
install -d "$STAGE/usr/share/man/man1"
gzip -9n <"$BUILD/segment-gateway.1" >"$STAGE/usr/share/man/man1/segment-gateway.1.gz"
chmod 0644 "$STAGE/usr/share/man/man1/segment-gateway.1.gz"

# -- monitoring ---------------------------------------------------------------------
# Prometheus alerting rules and a Grafana dashboard (docs/OPERATIONS.md, "Monitoring").
install -D -m 0644 -t "$STAGE/usr/share/segment-gateway" \
    packaging/monitoring/alerts.yml packaging/monitoring/dashboard.json

# -- the rest of the tree ---------------------------------------------------------
install -d "$STAGE/usr/bin"
ln -s "$PREFIX/bin/segment-gateway" "$STAGE/usr/bin/segment-gateway"
install -D -m 0644 systemd/segment-gateway.service "$STAGE/usr/lib/systemd/system/segment-gateway.service"
install -D -m 0644 systemd/segment-gateway.tmpfiles "$STAGE/usr/lib/tmpfiles.d/segment-gateway.conf"
install -D -m 0644 systemd/segment-gateway.sysusers "$STAGE/usr/lib/sysusers.d/segment-gateway.conf"
install -D -m 0644 packaging/gateway.toml "$STAGE/etc/segment-gateway/gateway.toml"
install -d "$STAGE/usr/share/doc/segment-gateway"
install -m 0644 docs/OPERATIONS.md docs/CONFIG.md packaging/copyright "$STAGE/usr/share/doc/segment-gateway/"

# -- control ----------------------------------------------------------------------
# Shared libraries the venv's extension modules link against, as the Debian
# packages that own them (what dpkg-shlibdeps would find, minus versions).
ldd_out=$(find "$VENV" -type f -name '*.so*' -exec ldd {} + 2>/dev/null || true)
if grep -q 'not found' <<<"$ldd_out"; then
    die "unresolved shared libraries: $(grep 'not found' <<<"$ldd_out" | sort -u)"
fi
# Libraries shipped in the venv itself (libfuse3.so.4) belong to no package.
libdeps=$(
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$ldd_out" | sort -u |
        while read -r lib; do [[ "$(realpath -m "$lib")" == "$VENV"/* ]] || echo "$lib"; done |
        while read -r lib; do
            dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null ||
                dpkg -S "${lib#/usr}" 2>/dev/null || die "no Debian package owns $lib"
        done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g'
)
[ -n "$libdeps" ] || die "found no shared library dependencies (ldd missing?)"
mkdir -p "$STAGE/DEBIAN"
cat >"$STAGE/DEBIAN/control" <<EOF
Package: segment-gateway
Version: $debversion
Architecture: $arch
Maintainer: $(git log -1 --format='%an <%ae>' 2>/dev/null || echo 'Segment Gateway maintainers <root@localhost>')
Installed-Size: $(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
Depends: python3 (>= 3.11), $py, fuse3, $libdeps, systemd | adduser
Section: admin
Priority: optional
Description: append-only segments, journaled locally, tiered to S3, mounted via FUSE
 Segment Gateway is a storage-node daemon: writers append to named
 segments over TCP; each append is durable in a local journal before it
 is acknowledged, the data rolls to S3 (or an embedded S3 server) in the
 background, and every segment is a read-only file under a FUSE mount.
 .
 Self-contained: the daemon and its Python dependencies live in a virtual
 environment under $PREFIX, run by the system's $py.
EOF
echo /etc/segment-gateway/gateway.toml >"$STAGE/DEBIAN/conffiles"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$STAGE/DEBIAN/"

rm -f "$deb"
dpkg-deb --build --root-owner-group -Z"$COMPRESS" "$STAGE" "$deb" >/dev/null
echo "build_deb: $deb ($(du -h "$deb" | cut -f1))"
