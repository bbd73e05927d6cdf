#!/usr/bin/env bash
# Writes segment-gateway(1) to $1 (default: stdout): generated from the
# command's argparse definitions (gateway/cli) by argparse-manpage, a
# build-time dependency in .venv (the dev extra), with the sections of
# packaging/segment-gateway.1.include. packaging/build_deb.sh installs it.
# Dated by the last commit (SOURCE_DATE_EPOCH), so the same tree gives the
# same page.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gateway/__init__.py)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH
exec .venv/bin/argparse-manpage --module gateway.cli.program --function build_parser \
    --prog segment-gateway --project-name segment-gateway --version "$version" \
    --description "append-only segments, journaled locally, tiered to S3, mounted via FUSE" \
    --manual-title "Segment Gateway" --include packaging/segment-gateway.1.include \
    --output "${1:-/dev/stdout}"
