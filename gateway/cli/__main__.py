"""``python -m gateway.cli``: the ``segment-gateway`` command."""

import sys

from gateway.cli.program import main

sys.exit(main())
