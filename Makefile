# flux-sim — build, test, bench.
#   make            build/flux-sim (and build/libfluxsim.a, shared with the oracle)
#   make test       every unit and integration test; non-zero exit on any failure
#   make bench      benchmarks (not tests): see docs/performance.md
#   make golden     regenerate golden/ (see golden/README.md)
#   make matrix     regenerate docs/detection-matrix.md from real --inject runs
#   make fuzz       libFuzzer harnesses tests/fuzz/fuzz_*.c, FUZZ_SECONDS each (tests/fuzz/README.md)
#   make sanitize   the test suite on an ASan + UBSan + LSan build in build-san/ (docs/reliability.md)
#   make valgrind   memcheck of one single-rank run (tests/valgrind.sh)
# Dependencies come from pkg-config and mpicc; nothing is hard-coded.

CC      := mpicc
PKGS    := openblas hdf5-openmpi libcjson
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
CMOCKA_CFLAGS := $(shell pkg-config --cflags cmocka)
CMOCKA_LIBS   := $(shell pkg-config --libs cmocka)

OPT     ?= -O2
CFLAGS  ?= $(OPT) -g -march=x86-64-v2
CFLAGS  += -fopenmp -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Isim -Ioracle $(PKG_CFLAGS)
LDLIBS  := $(PKG_LIBS) -fopenmp -lm

B := build
SIM_SRC    := $(filter-out sim/main_%.c,$(wildcard sim/*.c))
ORACLE_SRC := $(filter-out oracle/main_%.c,$(wildcard oracle/*.c))
LIB_OBJ    := $(patsubst %.c,$(B)/%.o,$(SIM_SRC) $(ORACLE_SRC))
LIB        := $(B)/libfluxsim.a
HDRS       := $(wildcard sim/*.h sim/*.inc oracle/*.h)

TEST_SRC   := $(wildcard tests/test_*.c)
TEST_BIN   := $(patsubst tests/%.c,$(B)/tests/%,$(TEST_SRC))
BENCH_SRC  := $(wildcard tools/bench_*.c)
BENCH_BIN  := $(patsubst tools/%.c,$(B)/%,$(BENCH_SRC))

.PHONY: all test unit integration bench golden matrix clean
ORACLE_MAIN := $(wildcard oracle/main_flux_oracle.c)
ORACLE_BIN  := $(if $(ORACLE_MAIN),$(B)/flux-oracle)
all: $(B)/flux-sim $(ORACLE_BIN) $(TEST_BIN) $(BENCH_BIN)

$(B)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/flux-sim: $(B)/sim/main_flux_sim.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(B)/flux-oracle: $(B)/oracle/main_flux_oracle.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(B)/tests/%: tests/%.c $(LIB) $(HDRS) tests/test_util.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CMOCKA_CFLAGS) $< $(LIB) -o $@ $(LDLIBS) $(CMOCKA_LIBS)

$(B)/bench_%: tools/bench_%.c $(LIB) $(HDRS)
	$(CC) $(CFLAGS) -O3 $< $(LIB) -o $@ $(LDLIBS)

# Tests need the CLIs built first (integration tests call them).
$(TEST_BIN): | $(B)/flux-sim $(ORACLE_BIN)

# Tests run from the repo root; they find ../shared/reference through FLUX_REFERENCE_DIR
# (default: ../shared/reference) and report SKIPPED loudly when it is absent.
test: all
	@tools/run-tests.sh

bench: all
	@tools/run-bench.sh

golden: $(B)/flux-sim
	@tools/make-golden.sh

# Detection matrix (bug x layout -> first divergence) from real runs: docs/detection-matrix.md
matrix: all
	@tools/detection-matrix.sh > docs/detection-matrix.md.tmp && mv docs/detection-matrix.md.tmp docs/detection-matrix.md
	@echo "wrote docs/detection-matrix.md"

clean:
	rm -rf $(B) build-san

# ---- fuzzing (tests/fuzz/README.md) -------------------------------------------------------
# Every tests/fuzz/fuzz_*.c is a libFuzzer harness, built with clang against the library
# compiled with clang, ASan, UBSan (no recovery: a report is a crash) and coverage, in build/fuzz/.
# `make fuzz` runs each for FUZZ_SECONDS on its corpus tests/fuzz/corpus/<name>/ (new inputs go to
# build/fuzz/work/<name>/, crashes to build/fuzz/artifacts/<name>/) and fails on any crash.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 30
FZ           := build/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS  := -g -O1 -fno-omit-frame-pointer -fopenmp -std=c11 -D_GNU_SOURCE -Wall -Wno-unused-parameter -Wno-pass-failed \
                -Isim -Ioracle $(PKG_CFLAGS) $(shell mpicc --showme:compile)
FUZZ_LDLIBS  := $(PKG_LIBS) $(shell mpicc --showme:link) -fopenmp -lm
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN     := $(patsubst tests/fuzz/%.c,$(FZ)/%,$(FUZZ_SRC))
FUZZ_LIB     := $(FZ)/libfluxsim-fuzz.a

$(FZ)/lib/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_LIB): $(patsubst %.c,$(FZ)/lib/%.o,$(SIM_SRC) $(ORACLE_SRC))
	@rm -f $@
	ar rcs $@ $^

$(FZ)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB) $(HDRS) $(wildcard tests/fuzz/*.h)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer $< $(FUZZ_LIB) -o $@ $(FUZZ_LDLIBS)

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BIN)
fuzz: fuzz-build
	@tools/run-fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

# ---- sanitizers (docs/reliability.md) -------------------------------------------------------
# `make sanitize`: everything rebuilt with ASan + UBSan (and float-cast-overflow, which gcc's
# -fsanitize=undefined leaves out) in build-san/, then the whole test suite run on those binaries
# (tools/run-sanitize.sh: any ASan, UBSan or LeakSanitizer report fails it). ~18 minutes on 2 cores.
# OPT, not CFLAGS: a command-line CFLAGS would replace -fopenmp -Isim ... (see CFLAGS above).
SAN_B   := build-san
SAN_OPT := -O1 -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer
.PHONY: sanitize sanitize-build valgrind
sanitize-build:
	$(MAKE) B=$(SAN_B) OPT="$(SAN_OPT)" all
sanitize: sanitize-build
	@FLUX_BUILD=$(SAN_B) tools/run-sanitize.sh

# valgrind of one single-rank run (memcheck, Open MPI suppressions): ~2 minutes, not in make test
valgrind: $(B)/flux-sim
	@FLUX_BUILD=$(B) bash tests/valgrind.sh
