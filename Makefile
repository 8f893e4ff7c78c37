PYTHON ?= python3
PIP := $(PYTHON) -m pip

# Pinned so that pip never resolves torch from the index (which would pull the CUDA build).
TORCH_PIN := torch==2.13.0
TORCH_MIN := (2, 11)

# Exits 0 when an importable torch is at least TORCH_MIN.
TORCH_OK := $(PYTHON) -c "import sys, torch; \
	sys.exit(tuple(int(p) for p in torch.__version__.split('.')[:2]) < $(TORCH_MIN))"

LINT_PATHS := src tests benchmarks

.PHONY: install test test-other-torch demo lint cuda-check sweep zoo

install:
	@$(TORCH_OK) 2>/dev/null || $(PIP) install "$(TORCH_PIN)"
	$(PIP) install -e ".[test,bench]"

# Two pytest workers (pytest-xdist), each test module whole on one (its module fixtures made
# once): half the suite waits on compile processes and subprocesses, so two workers on two
# cores take about 9 minutes where one takes 14. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
PYTEST := $(PYTHON) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope

test: install
	$(PYTEST) -m "not zoo" tests

# The suite on another torch release (default: the oldest supported) in a virtual environment of
# its own, .venv-torch-$(OTHER_TORCH): torch from the package index, its CUDA build (gigabytes,
# downloaded once), run on CPU. `make test` stays on the pinned CPU build.
OTHER_TORCH ?= 2.11.0
OTHER_VENV := .venv-torch-$(OTHER_TORCH)
test-other-torch:
	test -x $(OTHER_VENV)/bin/python || $(PYTHON) -m venv $(OTHER_VENV)
	$(OTHER_VENV)/bin/python -m pip install "torch==$(OTHER_TORCH)"
	$(OTHER_VENV)/bin/python -m pip install -e ".[test,bench]"
	$(OTHER_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope \
		-m "not zoo" tests

# The whole model zoo (every generation and image model, dynamic batches, static kernels,
# background kernels, bit-for-bit against Dynamo alone) and its table in docs/zoo.md, with eager
# and replay times.
zoo: install
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/e2e/test_zoo.py
	PYTHONPATH=src:tests $(PYTHON) -m zoo.table --out docs/zoo.md

demo: install
	$(PYTHON) -m npugraph_ex.cli bench --out bench-results/bench.json --plot bench-results/bench.png

# PyTorch's OpInfo database through the backend, compared with aot_eager (tests/sweep): float32
# with static shapes (each op also between copies: its tensors the graph's intermediates) and
# with dynamic=True, each also in place (x.add_); then bf16 and int64 (a breadth subset, fewer
# samples per op); then that subset on static kernels (static_kernel_compile=True: Inductor's
# kernels for each key; float32 also in place and with dynamic=True). Writes docs/sweep.md (and
# every result to sweep-results/sweep.json). About 50 minutes on 2 cores.
SWEEP := $(PYTHON) tests/sweep/opinfo_sweep.py --json sweep-results/sweep.json --out docs/sweep.md
ON_KERNELS := --options static_kernel_compile=True --timeout 300
# The bf16 and int64 runs: a breadth subset of the database (each family of ops a model uses).
BREADTH_OPS := abs,neg,exp,log,tanh,rsqrt,sigmoid,nn.functional.gelu,nn.functional.silu,nn.functional.relu
BREADTH_OPS := $(BREADTH_OPS),nn.functional.softplus,add,sub,mul,div.*,pow,remainder,fmod,floor_divide,maximum,minimum
BREADTH_OPS := $(BREADTH_OPS),clamp,clamp_min,clamp_max,eq,lt,ge,where,masked_fill,lerp,addcmul,round,bitwise_*
BREADTH_OPS := $(BREADTH_OPS),__rand__,__ror__,__rxor__,sum,mean,prod,amax,amin,var,logsumexp,argmax,cumsum,cumprod
BREADTH_OPS := $(BREADTH_OPS),sort,argsort,topk,mm,addmm,bmm,baddbmm,matmul,einsum,nn.functional.linear,nn.functional.conv1d
BREADTH_OPS := $(BREADTH_OPS),nn.functional.conv2d,index_select,index_add,index_copy,index_put,gather,scatter,scatter_add
BREADTH_OPS := $(BREADTH_OPS),scatter_reduce.*,take_along_dim,__getitem__,nn.functional.embedding,nn.functional.embedding_bag
BREADTH_OPS := $(BREADTH_OPS),reshape,view,transpose,permute,narrow,expand,flatten,squeeze,unbind,cat,stack,split
BREADTH_OPS := $(BREADTH_OPS),softmax,log_softmax,nn.functional.layer_norm,nn.functional.rms_norm,nn.functional.group_norm
BREADTH_OPS := $(BREADTH_OPS),nn.functional.interpolate.nearest,nn.functional.pad.constant,to,float,long,nn.functional.mse_loss

sweep: install
	mkdir -p sweep-results
	$(SWEEP) --dtype float32 --limit-samples 3 --variants function,operator,intermediate,inplace
	$(SWEEP) --dtype float32 --limit-samples 3 --dynamic --variants function,operator,inplace
	$(SWEEP) --dtype bfloat16 --limit-samples 2 --ops '$(BREADTH_OPS)'
	$(SWEEP) --dtype int64 --limit-samples 2 --ops '$(BREADTH_OPS)'
	$(SWEEP) --dtype float32 --limit-samples 2 --ops '$(BREADTH_OPS)' $(ON_KERNELS) \
		--variants function,intermediate,inplace
	$(SWEEP) --dtype float32 --limit-samples 2 --ops '$(BREADTH_OPS)' $(ON_KERNELS) --dynamic \
		--variants function,inplace
	$(SWEEP) --dtype bfloat16 --limit-samples 2 --ops '$(BREADTH_OPS)' $(ON_KERNELS)
	$(SWEEP) --dtype int64 --limit-samples 2 --ops '$(BREADTH_OPS)' $(ON_KERNELS)

lint:
	$(PYTHON) -m ruff check $(LINT_PATHS)
	$(PYTHON) -m ruff format --check $(LINT_PATHS)

# On a machine with an NVIDIA GPU and torch already installed (no network needed), in one run of
# at most 8 minutes: the CUDA tests, a replay's host time with outputs held or not, the bench in
# float16 and bfloat16 on the tiny model and Qwen3-0.6B beside reduce-overhead and inductor (with
# the weights-over-bandwidth limit), and where the growing loop's peak memory comes from
# (benchmarks/cuda_check.py; its results go to $OUT
# or bench-results/cuda-check, and `python benchmarks/cuda_check.py --apply DIR` puts their
# section into docs/benchmarks.md). `python benchmarks/cuda_check.py --dry-run` runs it on CPU.
cuda-check:
	$(PIP) install --no-deps --no-build-isolation -e .
	$(PYTHON) benchmarks/cuda_check.py --out-dir $${OUT:-bench-results/cuda-check}
