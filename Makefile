# The two commands a newcomer needs are `make run` and `make test`; both
# install what is missing first (scripts/bootstrap.sh).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install run test proto lint bench clean

install:
	@scripts/bootstrap.sh

# `serve` arrives with the segment container and wire protocol (issue 3);
# until then say so instead of pretending.
run: install
	@echo "make run: 'segment-gateway serve' is not built yet. Built so far: the Tier-1"
	@echo "journal ($(VENV)/bin/segment-gateway journal-dump, check-config). See README.md."
	@exit 1

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

proto: install
	$(PY) scripts/gen_proto.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: install
	@scripts/bootstrap.sh fio
	$(PY) bench/journal.py --write-table docs/PERFORMANCE.md

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
