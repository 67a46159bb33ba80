# `make demo` and `make test` set everything up on a fresh machine (scripts/setup.sh) first.
VENV := .venv/.installed

$(VENV): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

SUITES := conversion heal training analysis studies gpu maintenance
.PHONY: setup demo test $(addprefix bench-,$(SUITES))
setup: $(VENV)

demo: $(VENV)
	.venv/bin/mixln-convert demo --resume  # a rerun keeps what an earlier one finished

test: $(VENV)
	.venv/bin/python -m pytest

# `make bench-heal`: every case of a suite at its defaults (python -m benchmarks --help lists them and
# their times); ARGS=--quick: each at its smallest size, a smoke run
$(addprefix bench-,$(SUITES)): bench-%: $(VENV)
	.venv/bin/python -m benchmarks $* $(ARGS)
