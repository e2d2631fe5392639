# Developer entry points. `make app` and `make test` each install whatever is missing
# into .venv (first run only, or when pyproject.toml changes) and then do their job.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# The CPU build on these machines; set TORCH=torch to let pip pick your platform's default build.
TORCH ?= torch==2.13.0

.PHONY: app test clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.app: pyproject.toml | $(PY)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(PY)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

app: $(VENV)/.app
	$(VENV)/bin/qwendesk

test: $(VENV)/.test
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

clean:
	rm -rf $(VENV)
