# The two commands that set everything up on a fresh Debian 12 machine:
#   make demo   installs dependencies, builds, trains the default CNN for 1 epoch
#   make test   installs dependencies, builds, runs the whole test suite (ctest),
#               then the suite again under ASan+UBSan and a short fuzzing pass (what CI runs)
# For a quick loop while developing: make check (the ctest suite only).
BUILD ?= build
SAN_BUILD ?= build-san
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 120
# Tests run two at a time: each uses one or two threads, and the CLI tests write per-test files.
CTEST_JOBS ?= 2
CI_FUZZ_SECONDS ?= 30

.PHONY: setup configure build demo check test sanitize-configure sanitize fuzz cuda-check bench install clean

# make demo installs what the demo needs; the test targets ask for their tools too. make test
# also makes .venv-cuda (torch 2.14.1 with torchvision): the tests that load torchvision's
# models (the ViT, resnet18 from Python) run only with it, and make cuda-check uses it.
SETUP_ARGS ?=
check sanitize-configure sanitize fuzz: SETUP_ARGS = --test

setup:
	bash scripts/setup.sh $(SETUP_ARGS)

configure: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DMIXTRAIN_UNITY_BUILD=$(UNITY) \
	  -DMIXTRAIN_BENCH_IN_ALL=$(BENCH_IN_ALL) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The demo builds only the CLI (the test suite is make check's), as a unity build: the
# library's sources compiled in batches, each batch paying for torch's headers once
# (2.4x faster from nothing, BENCHMARKS.md). make check builds file by file, so that an
# edit recompiles one file; the first make check after make demo recompiles the library.
UNITY ?= OFF
# make test leaves out the benchmarks no test runs (.ci/run compiles them after it).
BENCH_IN_ALL ?= ON
demo: UNITY = ON
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target mixtrain_cli
	./$(BUILD)/tools/mixtrain/mixtrain train --epochs 1 --force --out runs/demo

check: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(CTEST_JOBS)

# .venv-cuda first (a prerequisite would run after check had configured without it).
# make test is the build from nothing (CI, a fresh clone): its suite is a unity build too
# (the library, the CLI and the tests in batches); a make check after it goes back to
# file by file, recompiling once. It compiles only the benchmark a test runs (gpu_bench);
# the others are 1.5 minutes of a 2-core machine's compile, built by `make bench` and by
# CI after make test (.ci/run).
test:
	bash scripts/setup.sh --cuda
	$(MAKE) check UNITY=ON BENCH_IN_ALL=OFF
	$(MAKE) sanitize
	$(MAKE) fuzz FUZZ_SECONDS=$(CI_FUZZ_SECONDS)

# One clang build serves both: everything under ASan+UBSan, fuzz targets with libFuzzer.
# Nobody edits in it file by file, so its library is a unity build (3 min under ASan here).
sanitize-configure: setup
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMIXTRAIN_SANITIZE=ON -DMIXTRAIN_BUILD_FUZZ=ON -DMIXTRAIN_BUILD_BENCH=OFF -DMIXTRAIN_BUILD_EXAMPLES=OFF \
	  -DMIXTRAIN_UNITY_BUILD=ON

# The ctest suite under ASan+UBSan (the installed-package test is left out: it
# builds a separate project with the default compiler, which cannot link ASan objects).
sanitize: sanitize-configure
	cmake --build $(SAN_BUILD) -j $(JOBS) --target mixtrain_tests mixtrain_cli
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(CTEST_JOBS) -E InstalledPackageExample

fuzz: sanitize-configure
	cmake --build $(SAN_BUILD) -j $(JOBS) --target idx_fuzz checkpoint_fuzz pure_bf16_checkpoint_fuzz tensor_file_fuzz scripted_model_fuzz
	bash scripts/fuzz.sh $(SAN_BUILD) $(FUZZ_SECONDS)

# The CUDA compile check: library, CLI, tests and gpu_bench built against torch 2.14.1+cu130
# (pip, in .venv-cuda) with the installed CUDA toolkit; compile and link only (no GPU here).
# CI runs it after make test (.ci/run); see README "Supported torch versions".
cuda-check:
	bash scripts/cuda-check.sh build-cuda

bench: build
	cmake --build $(BUILD) -j $(JOBS) --target benches
	bash bench/run_all.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(SAN_BUILD) build-cuda
