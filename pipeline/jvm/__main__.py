"""``python -m pipeline.jvm [--force]``: build the JVM reader's jar (`pipeline.jvm.build`)."""

from __future__ import annotations

import sys

from pipeline.jvm import BuildError, build


def main() -> int:
    """Build the jar; print its path, or why it could not be built."""
    try:
        print(build(force="--force" in sys.argv[1:]))
    except BuildError as e:
        print(f"pipeline.jvm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
