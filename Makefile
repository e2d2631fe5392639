# Developer entry points. `make app` and `make test` each install whatever is missing
# into .venv (first run only, when pyproject.toml changes, or when TORCH does) and then do their job.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# torch==2.13.0 is the CPU build on these machines; TORCH=torch lets pip pick your platform's default
# build. The venv remembers the TORCH it has (.venv/.torch): later runs keep it, a different TORCH replaces it.
TORCH ?= $(or $(shell cat $(VENV)/.torch 2>/dev/null),torch==2.13.0)

.PHONY: app test clean FORCE

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# rewritten (so that what depends on it reinstalls) only when TORCH differs from what is installed
$(VENV)/.torch: FORCE | $(PY)
	@if [ "$$(cat $@ 2>/dev/null)" != "$(TORCH)" ]; then \
		set -e; [ ! -f $@ ] || $(PY) -m pip uninstall -q -y torch; \
		$(PY) -m pip install -q "$(TORCH)"; echo "$(TORCH)" > $@; fi

$(VENV)/.app: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e ".[test]"
	touch $@

app: $(VENV)/.app
	$(VENV)/bin/qwendesk

test: $(VENV)/.test
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

clean:
	rm -rf $(VENV)
