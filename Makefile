# Developer entry points. `make app` and `make test` each install whatever is missing
# into .venv (first run only, when pyproject.toml changes, or when TORCH does) and then do their job.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# torch==2.13.0 is the CPU build on these machines; TORCH=torch lets pip pick your platform's default
# build. The venv remembers the TORCH it has (.venv/.torch): later runs keep it, a different TORCH replaces it.
TORCH ?= $(or $(shell cat $(VENV)/.torch 2>/dev/null),torch==2.13.0)

.PHONY: app test check-consumer soak package test-package clean FORCE

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

$(VENV)/.package: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e ".[test,package]"
	touch $@

app: $(VENV)/.app
	$(VENV)/bin/qwendesk

test: $(VENV)/.test
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

# The consumer-GPU readiness check (minutes, no GPU): every Triton launch of the 27B / 9B / 35B-A3B forwards
# compiled for sm_86, sm_89 and sm_120 and checked against those cards (engine/readiness/check.py says what).
check-consumer: $(VENV)/.test
	$(PY) -m engine.readiness.check

# The full soak (2,000 mixed requests against qwendesk-serve on a tiny CPU model; docs/reliability.md)
soak: $(VENV)/.test
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m soak tests/test_soak.py

# The frozen app (dist/qwendesk/) and the Linux AppDir (dist/QwenDesk.AppDir/; packed into an AppImage where
# appimagetool is on PATH). installer/README.md says what each step does.
package: $(VENV)/.package
	$(PY) -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
		installer/qwendesk.spec
	$(PY) -m installer.linux.build_appdir

# A local wheel folder with the CPU runtime: the first launch's offline install in the packaging tests.
build/wheels: $(VENV)/.package
	$(PY) -m pip download -q --only-binary=:all: -d $@ $$($(PY) -m installer.firstrun.plan cpu)

# The packaging tests (minutes): smoke runs of the venv, the frozen app and the AppDir, the desktop files,
# the workflows. desktop-file-validate and appstreamcli come from Debian's desktop-file-utils and appstream.
test-package: package build/wheels
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m package

clean:
	rm -rf $(VENV)
