# Two commands on a fresh machine: `make demo` and `make test`. Both create and reuse .venv by themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SOURCES := asyncq tests examples benchmarks

.PHONY: demo test lint typecheck unit bench browser pgbouncer clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/fanout.py

test: lint unit

lint: $(STAMP)
	$(VENV)/bin/ruff check $(SOURCES)
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/mypy --strict asyncq
	$(VENV)/bin/lint-imports

# Two test processes (pytest-xdist), one per core, each taking whole files (``loadfile``: a module's fixtures, the
# chaos runs' among them, are built once). Every test's state is its own (files under tmp_path, a PostgreSQL database
# per process, OS-assigned ports), so the two never meet.
unit: $(STAMP) browser pgbouncer
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

# Debian's Chromium for the browser tests: installed when missing and we may (root); otherwise the tests
# say why they skip (or fail, under CI=true).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
	      || echo "could not install chromium: browser tests will skip or fail under CI"; \
	  else echo "chromium missing and not root: browser tests will skip"; fi; \
	fi

# Debian's PgBouncer for the postgresql-pgbouncer driver (tests/pgbouncer_support.py starts it itself; the
# package's own service is never started): installed when missing and we may (root).
pgbouncer:
	@if [ ! -x /usr/sbin/pgbouncer ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null) \
	      || echo "could not install pgbouncer: its tests will skip or fail under CI"; \
	  else echo "pgbouncer missing and not root: its tests will skip"; fi; \
	fi

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[peers]'
	$(PY) benchmarks/claim_depth.py
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/http_delivery.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
