# The two commands that set everything up on a fresh Debian 12 machine:
#   make demo   installs dependencies, builds, trains the default CNN for 1 epoch
#   make test   installs dependencies, builds, runs the whole test suite (ctest)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build demo test bench install clean

setup:
	bash scripts/setup.sh

configure: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/tools/mixtrain/mixtrain train --epochs 1 --out runs/demo

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j 1

bench: build
	bash bench/run_all.sh $(BUILD)

clean:
	rm -rf $(BUILD)
