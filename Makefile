PYTHON ?= python3
PIP := $(PYTHON) -m pip

# Pinned so that pip never resolves torch from the index (which would pull the CUDA build).
TORCH_PIN := torch==2.13.0
TORCH_MIN := (2, 11)

# Exits 0 when an importable torch is at least TORCH_MIN.
TORCH_OK := $(PYTHON) -c "import sys, torch; \
	sys.exit(tuple(int(p) for p in torch.__version__.split('.')[:2]) < $(TORCH_MIN))"

LINT_PATHS := src tests benchmarks

.PHONY: install test demo lint cuda-check sweep

install:
	@$(TORCH_OK) 2>/dev/null || $(PIP) install "$(TORCH_PIN)"
	$(PIP) install -e ".[test,bench]"

test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider tests

demo: install
	$(PYTHON) -m npugraph_ex.cli bench --out bench-results/bench.json --plot bench-results/bench.png

# PyTorch's OpInfo database through the backend, compared with aot_eager (tests/sweep): float32
# with static shapes and with dynamic=True, then bf16 and int64 with fewer samples per op. Writes
# docs/sweep.md (and every result to sweep-results/sweep.json). One to two hours on 2 cores.
SWEEP := $(PYTHON) tests/sweep/opinfo_sweep.py --json sweep-results/sweep.json --out docs/sweep.md

sweep: install
	mkdir -p sweep-results
	$(SWEEP) --dtype float32 --limit-samples 3
	$(SWEEP) --dtype float32 --limit-samples 3 --dynamic
	$(SWEEP) --dtype bfloat16 --limit-samples 2
	$(SWEEP) --dtype int64 --limit-samples 2

lint:
	$(PYTHON) -m ruff check $(LINT_PATHS)
	$(PYTHON) -m ruff format --check $(LINT_PATHS)

# On a machine with an NVIDIA GPU and torch already installed (no network needed): the CUDA tests
# and the benchmark on the GPU with its peers.
cuda-check:
	$(PIP) install --no-deps --no-build-isolation -e .
	$(PYTHON) -m pytest -q -p no:cacheprovider -m cuda tests
	$(PYTHON) -m npugraph_ex.cli bench --device cuda --peers --out bench-results/bench-cuda.json \
		--plot bench-results/bench-cuda.png
