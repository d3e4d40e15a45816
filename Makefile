# strata — plain Makefile. `make` builds build/strata; see README.md for the rest.
# Detects the BLAS (OpenBLAS preferred, then BLIS, then any CBLAS).

CC      ?= gcc
BUILD   ?= build
OPT     ?= -O3 -march=native
CFLAGS  ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -g $(OPT) -Iinclude -pthread
# Math functions never set errno (nothing reads it): sqrtf becomes one
# instruction, so the AdamW loop vectorises; no result changes.
# Nothing traps on floating-point exceptions either: without
# -fno-trapping-math GCC 12 will not compute both sides of a select such as
# relu's `x > 0 ? x : 0` or GELU's, so those loops stay scalar wherever the
# target has no masked vector ops (AVX2: GELU was 20% of a gpt_tiny step).
# No result changes: the same operations run, in lanes.
CFLAGS  += -fno-math-errno -fno-trapping-math
LDLIBS  += -lyaml -lz -lm -pthread

ifneq ($(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h /usr/include/openblas/cblas.h),)
  CFLAGS += -DST_BLAS_OPENBLAS $(shell pkg-config --cflags openblas 2>/dev/null)
  LDLIBS += $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
else ifneq ($(shell pkg-config --exists blis 2>/dev/null && echo yes),)
  CFLAGS += -DST_BLAS_BLIS $(shell pkg-config --cflags blis)
  LDLIBS += $(shell pkg-config --libs blis)
else
  LDLIBS += -lcblas
endif

# MPI (Open MPI, Debian's libopenmpi-dev): multi-process runs. Used when
# Open MPI's compiler wrapper answers `mpicc --showme`; `make MPI=0` builds
# without it (a run started by mpirun then says what is missing). Changing
# it rebuilds everything (see $(BUILD)/flags below).
MPI ?= $(if $(shell mpicc --showme:compile 2>/dev/null),1,0)
ifeq ($(MPI),1)
  CFLAGS += -DST_MPI $(shell mpicc --showme:compile)
  LDLIBS += $(shell mpicc --showme:link)
endif

LIB_SRC   := $(sort $(filter-out src/cli/%,$(wildcard src/*/*.c)))
CLI_SRC   := $(sort $(wildcard src/cli/*.c))
TEST_SRC  := $(sort $(wildcard tests/*/test_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN  := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
DEPS      := $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

.PHONY: FORCE all deps demo demo-cluster demo-gpt demo-stream test test-asan test-tsan bench mutate format format-check clean tests benches

all: $(BUILD)/strata

# Rebuilt from scratch: `ar r` never drops members, so an object from a renamed
# or deleted source would otherwise linger and shadow the new one.
$(BUILD)/libstrata.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/strata: $(CLI_OBJ) $(BUILD)/libstrata.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Objects depend on this file too, and on the flags they were built with: a
# change of either (OPT, MPI, ...) rebuilds them.
FORCE:

$(BUILD)/flags: FORCE
	@mkdir -p $(@D)
	@echo '$(CC) $(CFLAGS) $(LDLIBS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) $(LDLIBS)' >$@

$(BUILD)/obj/%.o: %.c Makefile $(BUILD)/flags
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

# The narrow GEMM kernels ask for a * b + c as one FMA where the target has
# one (-std=c11 otherwise leaves products and sums apart): src/base/narrow.c
# spells its FMAs out on x86; this is for other targets.
# (private: not passed on to its prerequisites, $(BUILD)/flags among them)
$(BUILD)/obj/src/base/narrow.o: private CFLAGS += -ffp-contract=fast

$(BUILD)/tests/%: tests/%.c tests/harness.h $(wildcard tests/*/*.h) $(BUILD)/libstrata.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(BUILD)/libstrata.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)

# a preloaded library tests/io/test_durable.sh watches the syncs with;
# built plain (no sanitizer runtime of its own), whatever OPT says
$(BUILD)/tests/io/syncspy.so: tests/io/syncspy.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra -O2 -fPIC -shared -o $@ $< -ldl

tests: $(BUILD)/strata $(TEST_BIN) $(BUILD)/tests/io/syncspy.so
benches: $(BUILD)/strata $(BENCH_BIN)

deps:
	@tools/install-deps.sh

demo: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/strata train configs/fc_mnist.yaml --out runs/demo --overwrite

# A model larger than each rank may hold, trained over MPI ranks on this
# machine: a pipeline over 2 ranks and weight streaming over 3 (a store rank
# and 2 compute ranks), each printing every rank's memory and traffic.
demo-cluster: deps
	@$(MAKE) --no-print-directory all
	@tools/demo-cluster.sh $(BUILD)

# gpt_tiny on the `fortunes` package's cookie file: validation loss, then a
# sample from the final checkpoint.
demo-gpt: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/strata train configs/gpt_tiny.yaml --out runs/demo-gpt --overwrite
	$(BUILD)/strata generate - --checkpoint runs/demo-gpt --prompt 'The ' --tokens 300

# GPT-3 XL (1.3B) for a few steps by weight streaming from a file store of
# 36.8 GiB in runs/demo-stream (strata refuses at start when the disk lacks
# it); prints the loss per step and the peak resident memory it measured.
demo-stream: deps
	@$(MAKE) --no-print-directory all
	@echo "demo-stream: the store needs 36.8 GiB free under runs/ (two copies of the weights and AdamW state, and the gradients); a step takes minutes on a small machine"
	@rm -rf runs/demo-stream
	$(BUILD)/strata train configs/gpt3_xl_stream.yaml --out runs/demo-stream
	@echo "loss per step (runs/demo-stream/metrics.jsonl):"
	@grep '"type":"train"' runs/demo-stream/metrics.jsonl | sed 's/.*"step":\([0-9]*\).*"loss":\([0-9.]*\).*/  step \1  loss \2/'

test: deps
	@$(MAKE) --no-print-directory tests
	@tools/run-tests.sh $(BUILD)

# Sanitizer builds live in their own folders so they never mix with the fast build.
# They keep -march=native: the kernels they check are the ones the fast build
# runs (AVX2/AVX-512 and FMA paths of narrow.c), not a generic build's.
test-asan: deps
	@$(MAKE) --no-print-directory tests BUILD=build-asan OPT="-O1 -march=native -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 tools/run-tests.sh build-asan

test-tsan: deps
	@$(MAKE) --no-print-directory tests BUILD=build-tsan OPT="-O1 -march=native -fsanitize=thread"
	@tools/run-tests.sh build-tsan

# Mutation check of the pipelined-backprop tests: every rule of BACKGROUND.md
# 2 broken in turn, in a scratch copy; prints `caught N of N`.
mutate: deps
	@tools/mutate.sh $(BUILD)

bench:
	@tools/install-deps.sh --bench
	@$(MAKE) --no-print-directory benches
	@tools/run-bench.sh $(BUILD)

FORMAT_SRC = include/*.h src/*/*.c src/*/*.h tests/*.h tests/*/*.c tests/*/*.h bench/*.c bench/*.h

format:
	clang-format -i $(FORMAT_SRC)

# Fails, naming each file and line, where `make format` would change a thing.
format-check: deps
	@clang-format --dry-run --Werror $(FORMAT_SRC) && echo "format-check: every file as clang-format writes it"

clean:
	rm -rf build build-asan build-tsan

-include $(DEPS)
