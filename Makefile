# A thin layer over meson. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
BUILD ?= build
TANDEM := $(BUILD)/tandem
WORKLOAD ?= workloads/quickstart.yaml

.PHONY: all setup build run test test-unit test-golden bench bench-scheduler bench-sim bench-continuous bench-cpu \
        sim-vs-measured hf-check clean test-sanitize fuzz fuzz-build

all: build

$(BUILD)/build.ninja:
	tools/setup

setup:
	tools/setup

build: $(BUILD)/build.ninja
	ninja -C $(BUILD)

run: build
	$(TANDEM) run $(WORKLOAD)

# All suites (unit, traces; golden and cuda as they land). Skipped suites (exit 77) are
# reported as skipped. The last line is "N passed, N failed, N skipped".
test: build
	@set -o pipefail; meson test -C $(BUILD) --print-errorlogs 2>&1 | tee $(BUILD)/test-summary.log; rc=$$?; \
	  ok=$$(awk '/^Ok:/{print $$2}' $(BUILD)/test-summary.log); fail=$$(awk '/^Fail:/{print $$2}' $(BUILD)/test-summary.log); \
	  skip=$$(awk '/^Skipped:/{print $$2}' $(BUILD)/test-summary.log); to=$$(awk '/^Timeout:/{print $$2}' $(BUILD)/test-summary.log); \
	  echo "$${ok:-0} passed, $$(( $${fail:-0} + $${to:-0} )) failed, $${skip:-0} skipped"; exit $$rc

test-unit: build
	meson test -C $(BUILD) --suite unit --print-errorlogs

test-golden: build
	meson test -C $(BUILD) --suite golden --print-errorlogs

# The unit (cli included) and serve suites under AddressSanitizer + UndefinedBehaviorSanitizer and libstdc++'s
# bounds-checked containers (-D_GLIBCXX_ASSERTIONS: an out-of-range operator[] aborts) (gcc, its own
# build folder; any report fails the test). The golden suite stays with the plain build: it
# takes about 7 minutes under ASan.
SAN_BUILD ?= build-asan
$(SAN_BUILD)/build.ninja:
	meson setup $(SAN_BUILD) --buildtype=debugoptimized -Db_sanitize=address,undefined \
	  -Dcpp_args='-fno-sanitize-recover=undefined -D_GLIBCXX_ASSERTIONS' -Dcuda=disabled

test-sanitize: $(SAN_BUILD)/build.ninja
	ninja -C $(SAN_BUILD) tandem tests/unit_tests tests/policies_tests tests/transfer_tests
	ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  meson test -C $(SAN_BUILD) --suite unit --suite serve --no-rebuild --print-errorlogs --timeout-multiplier 5

# Fuzzing (tests/fuzz, libFuzzer + ASan + UBSan; clang 19 from `tools/setup --fuzz`): each
# target for FUZZ_SECONDS; FUZZ_TARGETS picks some (workload azure vidur mooncake safetensors
# hf_config profile compare run frame sweep). A new finding fails with its reproducer printed.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
FUZZ_ALL := workload azure vidur mooncake safetensors hf_config profile compare run frame sweep
$(FUZZ_BUILD)/build.ninja:
	@command -v clang++-19 >/dev/null || { echo "make fuzz: needs clang 19 (clang++-19, which tests/fuzz/clang.ini names;" \
	  "Debian 12's default clang++, 14, cannot build tandem): run tools/setup --fuzz first" >&2; exit 2; }
	meson setup $(FUZZ_BUILD) --native-file tests/fuzz/clang.ini -Dfuzz=true -Dcuda=disabled

fuzz-build: $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD) $(addprefix tests/fuzz/fuzz_,$(FUZZ_ALL))

fuzz: fuzz-build
	tests/fuzz/run.sh -b $(FUZZ_BUILD) -t $(FUZZ_SECONDS) $(FUZZ_TARGETS)

bench: bench-scheduler bench-sim bench-continuous bench-cpu

bench-scheduler: build
	$(BUILD)/tests/bench_scheduler

bench-sim: build
	@$(BUILD)/tests/bench_sim workloads/bench/vidur_comparable.yaml --header
	@$(BUILD)/tests/bench_sim workloads/bench/azure_conv_replay.yaml
	@$(BUILD)/tests/bench_sim workloads/bench/synthetic_1m.yaml

bench-continuous: build
	tools/bench-continuous --tandem $(TANDEM) workloads/mixed_long_short.yaml

bench-cpu: build
	$(BUILD)/tests/bench_cpu

# Calibrate the CPU backend, then the stage 1 CPU workload measured vs simulated.
sim-vs-measured: build
	tools/sim-vs-measured

# The CPU model against Hugging Face transformers (needs tools/hf-check-setup once).
hf-check: build
	tools/hf-check

clean:
	rm -rf $(BUILD)
