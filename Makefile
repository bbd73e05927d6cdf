# The two commands a newcomer needs are `make run` and `make test`; both
# install what is missing first (scripts/bootstrap.sh).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install run test test-fast proto lint bench deb clean torture

install:
	@scripts/bootstrap.sh

# Runs the daemon in the foreground with its data in ./data, Tier 2 in an
# embedded S3 server (SeaweedFS, data in ./data/s3) and the segments mounted
# read-only at ./mnt.
run: install
	@echo "make run: protocol on 127.0.0.1:9410, segments mounted at ./mnt, data in ./data, Tier 2 embedded (Ctrl-C stops)."
	$(VENV)/bin/segment-gateway serve --data-dir $(CURDIR)/data --listen 127.0.0.1:9410 \
		--mountpoint $(CURDIR)/mnt

# Two phases (tests/conftest.py): every test not marked serial on
# $(TEST_WORKERS) xdist workers, each module (the Spark ones and the tortures:
# each kind together) on one worker; then the serial ones alone. Each phase
# prints its slowest tests and its time (the parallel one's wall time also in
# a line of its own, before the serial phase starts: pytest's summary stays
# the last line). The exit status is the first failing phase's, and 5 (no
# test ran) only when neither phase ran one.
TEST_WORKERS ?= 2
test: install
	@set +e; start=$$(date +%s); \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup \
		--suite-phase=parallel $(PYTEST_ARGS); parallel=$$?; \
	echo "make test: the parallel phase took $$(($$(date +%s) - start)) s (exit $$parallel);" \
		"now the serial phase"; \
	$(PY) -m pytest --suite-phase=serial $(PYTEST_ARGS); serial=$$?; \
	for rc in $$parallel $$serial; do \
		case $$rc in 0|5) ;; *) exit $$rc ;; esac; \
	done; \
	[ $$parallel = 5 ] && [ $$serial = 5 ] && exit 5; exit 0

# A developer's loop: everything but the tests marked slow (daemons,
# SeaweedFS, Spark, crash loops); `make test` (what CI runs) runs them all.
test-fast: install
	$(PY) -m pytest -m "not slow" -x $(PYTEST_ARGS)

# The torture loops for longer than CI's short run (tests/torture): faults at
# random against a real daemon, SeaweedFS and mount, and against three nodes
# sharing one bucket; each prints a summary. SEGMENT_GATEWAY_TORTURE_SEED
# picks the faults' order.
TORTURE_SECONDS ?= 1800
torture: install
	SEGMENT_GATEWAY_TORTURE_SECONDS=$(TORTURE_SECONDS) $(PY) -m pytest -s \
		tests/torture

proto: install
	$(PY) scripts/gen_proto.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: install
	@scripts/bootstrap.sh fio
	$(PY) bench/journal.py --write-table docs/PERFORMANCE.md
	$(PY) bench/ingest.py --write-table docs/PERFORMANCE.md
	$(PY) bench/cli_append.py --write-table docs/PERFORMANCE.md
	$(PY) bench/read.py --write-table docs/PERFORMANCE.md
	$(PY) bench/tier2.py --write-table docs/PERFORMANCE.md
	$(PY) bench/fuse_read.py --write-table docs/PERFORMANCE.md
	$(PY) bench/spark_read.py --write-table docs/PERFORMANCE.md
	$(PY) bench/cluster_read.py --write-table docs/PERFORMANCE.md
	$(PY) bench/replication.py --write-table docs/PERFORMANCE.md
	$(PY) bench/failover.py --write-table docs/PERFORMANCE.md
	$(PY) bench/streams.py --write-table docs/PERFORMANCE.md
	$(PY) bench/spark_stream.py --write-table docs/PERFORMANCE.md
	$(PY) bench/attributes.py --write-table docs/PERFORMANCE.md

# dist/segment-gateway_<version>_<arch>.deb: the daemon in a venv under
# /opt/segment-gateway (Debian's python3), the systemd units, a default
# /etc/segment-gateway/gateway.toml (packaging/build_deb.sh).
deb: install
	packaging/build_deb.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
