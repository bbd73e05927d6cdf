#!/usr/bin/env bash
# Installs pyfuse3 with FUSE passthrough into a venv: libfuse 3.17.2 (Debian
# trixie's fuse3 source, the upstream tarball) under VENV/opt/libfuse, and
# pyfuse3 3.5.0 (its PyPI sdist) with packaging/patches/pyfuse3-3.5.0-passthrough.patch
# built against it, found at run time through an $ORIGIN-relative rpath, so the
# venv can move (the .deb's /opt/segment-gateway) and the system's
# libfuse3.so.3 stays as it is (this one's soname is libfuse3.so.4).
#
#   scripts/build_pyfuse3.sh VENV [PIP_PYTHON]
#
# PIP_PYTHON (default .venv/bin/python) is the interpreter whose pip builds
# and installs, with `--python VENV/bin/python` (the .deb's venv has no pip).
# Done once: the sources, the libfuse build and the wheel are kept in
# $SEGMENT_GATEWAY_BUILD_CACHE (default ~/.cache/segment-gateway), and a stamp
# in VENV says what is installed, so a second run returns at once.
# Bookworm's libfuse 3.14 cannot do passthrough (it needs >= 3.16); the
# gateway checks at run time whether the kernel granted it and otherwise
# serves reads itself, so a failure here is fatal only for the build.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(realpath -m "${1:?usage: scripts/build_pyfuse3.sh VENV [PIP_PYTHON]}")
pip_python=${2:-.venv/bin/python}

LIBFUSE_VERSION=3.17.2
LIBFUSE_URL=https://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${LIBFUSE_VERSION}.orig.tar.gz
LIBFUSE_SHA256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
PYFUSE3_VERSION=3.5.0
PYFUSE3_SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PATCH=packaging/patches/pyfuse3-${PYFUSE3_VERSION}-passthrough.patch
# From site-packages/pyfuse3/ (where the extension lands) up to the venv.
RPATH='$ORIGIN/../../../../opt/libfuse/lib'

cache=${SEGMENT_GATEWAY_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/segment-gateway}
patch_id=$(sha256sum <"$PATCH" | cut -c1-12)
want="libfuse $LIBFUSE_VERSION, pyfuse3 $PYFUSE3_VERSION, patch $patch_id"
stamp=$venv/.stamp-pyfuse3-passthrough
# Whether VENV's pyfuse3 is the patched one, linked with our libfuse. Without
# importing it: pyfuse3 imports trio, which may not be installed yet.
has_passthrough() {
    "$venv/bin/python" - <<'EOF'
import importlib.util, pathlib, subprocess, sys
spec = importlib.util.find_spec("pyfuse3")
ext = next(pathlib.Path(spec.origin).parent.glob("__init__.cpython-*.so"))
assert b"backing_open" in ext.read_bytes(), "pyfuse3 without the passthrough patch"
ldd = subprocess.run(["ldd", ext], capture_output=True, text=True, check=True).stdout
lib = pathlib.Path(sys.prefix, "opt", "libfuse", "lib", "libfuse3.so.4").resolve()
found = [l.split()[2] for l in ldd.splitlines() if l.split()[:2] == ["libfuse3.so.4", "=>"]]
assert [pathlib.Path(f).resolve() for f in found] == [lib], f"pyfuse3 must load {lib}:\n{ldd}"
EOF
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
    has_passthrough 2>/dev/null; then
    exit 0
fi
say() { echo "build_pyfuse3: $*"; }
start=$SECONDS

fetch() { # url sha256 file
    if [ -f "$3" ] && echo "$2  $3" | sha256sum -c --status; then return; fi
    curl -fsSL --retry 3 -o "$3.part" "$1"
    echo "$2  $3.part" | sha256sum -c --status || {
        echo "build_pyfuse3: $1 does not have the pinned sha256 $2" >&2
        exit 1
    }
    mv "$3.part" "$3"
}

# -- libfuse, built once per machine into the cache ----------------------------------
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
libfuse=$cache/libfuse-$LIBFUSE_VERSION-$arch
mkdir -p "$cache"
if [ ! -f "$libfuse/.done" ]; then
    say "building libfuse $LIBFUSE_VERSION into $libfuse"
    tarball=$cache/fuse3_$LIBFUSE_VERSION.orig.tar.gz
    fetch "$LIBFUSE_URL" "$LIBFUSE_SHA256" "$tarball"
    work=$(mktemp -d)
    tar -xzf "$tarball" -C "$work"
    rm -rf "$libfuse"
    # The library alone: no fusermount3 (the system's fuse3 package has
    # it), examples or tests. disable-mtab: nothing writes /etc/mtab now.
    (cd "$work/fuse-$LIBFUSE_VERSION" &&
        meson setup build --prefix="$libfuse" --libdir=lib --buildtype=release \
            -Dutils=false -Dexamples=false -Dtests=false -Ddisable-mtab=true >/dev/null &&
        ninja -C build -j1 install >/dev/null)
    rm -rf "$work"
    touch "$libfuse/.done"
fi
# Only the shared library goes into the venv: headers and pkg-config stay in
# the cache for building against.
# The file itself under its soname, which is all the loader looks for.
install -D -m 0644 "$(readlink -f "$libfuse/lib/libfuse3.so.4")" "$venv/opt/libfuse/lib/libfuse3.so.4"

# -- pyfuse3, one wheel per interpreter --------------------------------------------------
tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheels=$cache/pyfuse3-$PYFUSE3_VERSION-$patch_id-$LIBFUSE_VERSION/$tag
wheel=$(find "$wheels" -name 'pyfuse3-*.whl' 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    say "building pyfuse3 $PYFUSE3_VERSION with the passthrough patch for $tag"
    sdist=$cache/pyfuse3-$PYFUSE3_VERSION.tar.gz
    if [ ! -f "$sdist" ] || ! echo "$PYFUSE3_SHA256  $sdist" | sha256sum -c --status; then
        work=$(mktemp -d)
        "$pip_python" -m pip download --quiet --disable-pip-version-check --no-deps \
            --no-binary :all: "pyfuse3==$PYFUSE3_VERSION" -d "$work" 2>/dev/null
        echo "$PYFUSE3_SHA256  $work/pyfuse3-$PYFUSE3_VERSION.tar.gz" | sha256sum -c --status || {
            echo "build_pyfuse3: pyfuse3-$PYFUSE3_VERSION.tar.gz does not have the pinned sha256" >&2
            exit 1
        }
        mv "$work/pyfuse3-$PYFUSE3_VERSION.tar.gz" "$sdist"
        rm -rf "$work"
    fi
    work=$(mktemp -d)
    tar -xzf "$sdist" -C "$work"
    src=$work/pyfuse3-$PYFUSE3_VERSION
    patch -d "$src" -p1 --quiet --no-backup-if-mismatch <"$PATCH"
    rm -f "$src/src/pyfuse3/__init__.c" # generated from the unpatched .pyx
    PKG_CONFIG_PATH=$libfuse/lib/pkgconfig LDFLAGS="-Wl,-rpath,$RPATH" \
        "$pip_python" -m pip --python "$venv/bin/python" wheel --quiet \
        --disable-pip-version-check --no-deps -w "$wheels" "$src"
    rm -rf "$work"
    wheel=$(find "$wheels" -name 'pyfuse3-*.whl' | head -1)
fi
# --no-deps: trio comes with the project's own install, which then finds
# pyfuse3 3.5.0 installed and leaves it alone.
"$pip_python" -m pip --python "$venv/bin/python" install --quiet --disable-pip-version-check \
    --no-deps --force-reinstall --no-compile "$wheel"
has_passthrough || {
    echo "build_pyfuse3: the pyfuse3 installed in $venv is not the one just built" >&2
    exit 1
}
echo "$want" >"$stamp"
say "pyfuse3 $PYFUSE3_VERSION with passthrough installed in $venv ($((SECONDS - start)) s)"
