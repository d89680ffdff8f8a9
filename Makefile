PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/viano demo

lint: $(STAMP)
	$(BIN)/ruff check engine actors viano_bug_analysis viano_main.py tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collected no tests; that is a failure here, never a pass.
# -n 2 (pytest-xdist): two worker processes, one per core; each starts its own PostgreSQL.
pytest: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/store.py

clean:
	rm -rf $(VENV) build *.egg-info
