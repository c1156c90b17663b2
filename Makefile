# dspark — build, test, demo and benchmark entry points.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
DSPARK := $(BUILD_DIR)/dspark
PROMPTS ?= $(firstword $(wildcard ../shared/data/dev-prompts.jsonl) data/dev-prompts.jsonl)

.PHONY: setup build cli python cuda test test-full test-asan test-tsan test-arm fuzz demo bench clean

setup:
	@scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The `dspark` command only (the test suite is built by `build`).
cli: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target dspark

# The Python package (`import dspark`), built in the same tree as the command:
# only the extension module is compiled on top of `cli`.
python: cli
	scripts/pip_install_local.sh $(BUILD_DIR)

# A second build tree linked against PyTorch's CUDA libtorch (pip wheel), for
# `dspark train --device cuda`; runs the GPU-vs-CPU training checks.
cuda: setup
	scripts/setup_cuda.sh build-cuda

# One CTest test per GoogleTest suite, JOBS at a time (much of a test is
# process start-up, model loading and waiting on a server or client, so 2 run
# well on 2 cores). Per-test time limits: 20 minutes for the default slice;
# the exhaustive sweeps (e.g. 20,000-sample chi-square tests, about 25 minutes
# each) get 90 and run one at a time.
test: build python
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200
	DSPARK=$(DSPARK) python3 -m pytest -q tests/python

test-full: build python
	cd $(BUILD_DIR) && DSPARK_TEST_FULL=1 ctest --output-on-failure -j 1 --timeout 5400
	scripts/test_kernel_levels_full.sh $(BUILD_DIR)
	DSPARK=$(DSPARK) python3 -m pytest -q tests/python
	python3 scripts/soak.py --minutes 1 --binary $(DSPARK) -- -t 2

# libFuzzer targets (clang) in build-fuzz, each for FUZZ_SECONDS, two at a
# time; `make test` replays their committed corpora (fuzz_replay.* tests).
FUZZ_SECONDS ?= 60
fuzz: setup
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

# The suite under sanitizers (scripts/test_sanitized.sh): ASan + UBSan over
# every test in build-asan; TSan over the server, engine and runner tests.
test-asan: setup
	scripts/test_sanitized.sh asan

test-tsan: setup
	scripts/test_sanitized.sh tsan

# The kernel, model-family and lossless-decoding tests on aarch64 (NEON):
# cross-built in build-arm against an arm64 sysroot (scripts/setup_arm.sh)
# and run under qemu-user (scripts/test_arm.sh; README, "Tests and oracles").
test-arm: setup
	JOBS=$(JOBS) scripts/test_arm.sh build-arm

demo: cli python
	$(DSPARK) generate -m smollm2 --chat -n 96 --temp 0 \
	  -p "Explain in three sentences why the sky is blue."

# Plain vs speculative decoding, then plain decoding of dspark (both compute
# paths) against llama.cpp on the same GGUF (llama-bench from
# $LLAMACPP_DIR, default ~/.cache/llamacpp, when built).
BENCH_RUNS ?= 3
bench: cli
	$(DSPARK) bench -m smollm2 --prompts $(PROMPTS) -n 128 --temp 0 --runs $(BENCH_RUNS)
	DSPARK=$(DSPARK) scripts/bench_vs_llamacpp.sh --runs $(BENCH_RUNS) --prompts $(PROMPTS)

clean:
	rm -rf $(BUILD_DIR)
