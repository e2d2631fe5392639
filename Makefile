# Developer entry points. `make app` and `make test` each install whatever is missing
# into .venv (first run only, when pyproject.toml or constraints.txt changes, or when TORCH does) and then do their job.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# torch==2.13.0 is the CPU build on these machines; TORCH=torch lets pip pick your platform's default
# build. The venv remembers the TORCH it has (.venv/.torch): later runs keep it, a different TORCH replaces it.
PINNED_TORCH := torch==2.13.0
TORCH ?= $(or $(shell cat $(VENV)/.torch 2>/dev/null),$(PINNED_TORCH))
# Installs take the versions the suite passed with (constraints.txt, written by `make lock`), with the torch they were
# tested with; another TORCH installs the newest of everything, as `make test-latest` does.
LOCK  ?= $(if $(filter $(PINNED_TORCH),$(TORCH)),-c constraints.txt)

.PHONY: app test test-latest lock lint check-consumer check-consumer-all project-consumer soak check-plans package appimage test-package clean FORCE

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# rewritten (so that what depends on it reinstalls) only when TORCH differs from what is installed
$(VENV)/.torch: FORCE | $(PY)
	@if [ "$$(cat $@ 2>/dev/null)" != "$(TORCH)" ]; then \
		set -e; [ ! -f $@ ] || $(PY) -m pip uninstall -q -y torch; \
		$(PY) -m pip install -q $(LOCK) "$(TORCH)"; echo "$(TORCH)" > $@; fi

$(VENV)/.app: pyproject.toml constraints.txt $(VENV)/.torch
	$(PY) -m pip install -q $(LOCK) -e .
	touch $@

# dflash: the block drafter's reference (tests/test_dflash.py), without its exact pins of datasets, tqdm and requests
$(VENV)/.test: pyproject.toml constraints.txt $(VENV)/.torch
	$(PY) -m pip install -q $(LOCK) -e ".[test]"
	$(PY) -m pip install -q --no-deps dflash==0.1.0
	touch $@

$(VENV)/.package: pyproject.toml constraints.txt $(VENV)/.torch
	$(PY) -m pip install -q $(LOCK) -e ".[test,package]"
	touch $@

app: $(VENV)/.app
	$(VENV)/bin/qwendesk

test: $(VENV)/.test
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

# The suite against the newest release of every dependency (TORCH aside), in its own venv upgraded at each run: what
# the next lock would pin. When it passes, `make lock VENV=.venv-latest` writes those versions to constraints.txt.
test-latest:
	[ -x .venv-latest/bin/python ] || python3 -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade pip
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager "$(TORCH)" -e ".[test]"
	QT_QPA_PLATFORM=offscreen .venv-latest/bin/python -m pytest -q

# constraints.txt: the versions installed in $(VENV) of everything the project and its tests need (.ci/lock.py)
lock:
	$(PY) .ci/lock.py > constraints.txt.new && mv constraints.txt.new constraints.txt

# ruff over the four trees, and mypy over the three packages (pyproject.toml's [tool.ruff] and [tool.mypy]; ~10 s cold
# on 2 cores, under 1 s cached)
lint: $(VENV)/.test
	$(VENV)/bin/ruff check app engine qwendesk_kernels tests
	$(VENV)/bin/python -m mypy app engine qwendesk_kernels

# The consumer-GPU readiness check (no GPU): every Triton launch of the 27B / 9B / 35B-A3B forwards compiled for a
# card and checked against it (engine/readiness/check.py says what), one compile process per core (--workers N).
# CI checks the RTX 3090 (~10 min alone on 2 cores: four KV formats, rounds of 1-5 drafts, a block drafter's; .ci/run
# runs it beside the test suite); check-consumer-all the 4090 (sm_89) and 5090 (sm_120, the PDL path) too (about
# three times as long): run it after changing a kernel.
check-consumer: $(VENV)/.test
	$(PY) -m engine.readiness.check --cards "RTX 3090"

check-consumer-all: $(VENV)/.test
	$(PY) -m engine.readiness.check

# PROJECTED RTX 3090 / 4090 / 5090 figures (seconds, no GPU): the cost model calibrated on the measured H100/H200
# rows, its error on them, and where a step goes on each card (engine/readiness/projection.py).
project-consumer: $(VENV)/.test
	$(PY) -m engine.readiness.projection

# The full soak (2,000 mixed requests against qwendesk-serve on a tiny CPU model; docs/reliability.md)
soak: $(VENV)/.test
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m soak tests/test_soak.py tests/test_server_schemathesis.py

# Every first-launch plan (Linux and Windows x each PyTorch build x Python) through pip's resolver, against the package
# indexes this machine reaches, else the torch metadata captured in the repo (installer/check_plans.py)
check-plans: $(VENV)/.test
	$(PY) -m installer.check_plans

# The frozen app (dist/qwendesk/) and the Linux AppDir (dist/QwenDesk.AppDir/). installer/README.md says what each
# step does.
package: $(VENV)/.package
	$(PY) -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
		installer/qwendesk.spec
	$(PY) -m installer.linux.build_appdir

# The AppImage: the AppDir as a squashfs image (mksquashfs: Debian's squashfs-tools) behind the AppImage runtime
# given as APPIMAGE_RUNTIME=PATH; without one, the squashfs image alone (dist/QwenDesk-x86_64.squashfs).
appimage: package
	$(PY) -m installer.linux.build_appdir --pack

# A local wheel folder with the CPU runtime: the first launch's offline install in the packaging tests.
build/wheels: $(VENV)/.package
	$(PY) -m pip download -q --only-binary=:all: -d $@ $$($(PY) -m installer.firstrun.plan cpu)

# The packaging tests (minutes): smoke runs of the venv, the frozen app, the AppDir and the AppImage's contents, the
# offline first launch, the install folder left as installed, the bundle's glibc, the desktop files, the workflows.
# desktop-file-validate, appstreamcli and unsquashfs come from Debian's desktop-file-utils, appstream, squashfs-tools.
# Then the measured sizes go into installer/README.md (installer/measures.py).
test-package: appimage build/wheels
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m package
	$(PY) -m installer.measures

clean:
	rm -rf $(VENV)
