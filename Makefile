# The two commands: `make test` (build, then every test; GPU tests report skipped without GPUs)
# and `make bench` (build, then the benchmark suite on every local GPU).
BUILD ?= build
JOBS ?= $(shell nproc)
export PATH := /usr/local/cuda/bin:$(PATH)

.PHONY: deps configure build test bench clean

deps:
	@scripts/deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=$$(command -v nvcc) >/dev/null

build: configure
	@start=$$(date +%s); cmake --build $(BUILD) -j $(JOBS) && echo "weave: build took $$(( $$(date +%s) - start )) s"

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 900

bench: build
	@scripts/bench.sh

clean:
	rm -rf $(BUILD)
