"""The ``segment-gateway`` command.

One module per area, each adding its verbs beside their handlers:
`admin` (version, check-config, journal-dump, fsck, pipeline, serve,
export-metadata, import-metadata), `segments` (create, cat, ls, stat, attrs,
seal, flush, truncate, delete), `append` (the input pump), `cluster`,
`streams` (stream, txn). `values` holds the exact value parsers, `common`
what the commands share (configuration, connection options), `program` the
parser assembly and `main`. A new verb goes into the module of its area (or
a new module listed in `program.COMMAND_MODULES`).

trio, the client library and whatever a command runs are imported inside
the command that needs them: `version`, `check-config` and ``--help`` start
without them (trio alone is about a third of the start-up).
"""

from gateway.cli.program import build_parser, main

__all__ = ["build_parser", "main"]
