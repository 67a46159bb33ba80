# `make demo` and `make test` set everything up on a fresh machine (scripts/setup.sh) first.
VENV := .venv/.installed

$(VENV): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

.PHONY: setup demo test
setup: $(VENV)

demo: $(VENV)
	.venv/bin/mixln-convert demo --resume  # a rerun keeps what an earlier one finished

test: $(VENV)
	.venv/bin/python -m pytest
