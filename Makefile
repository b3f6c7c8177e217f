# flux-sim — build, test, bench.
#   make            build/flux-sim (and build/libfluxsim.a, shared with the oracle)
#   make test       every unit and integration test; non-zero exit on any failure
#   make bench      benchmarks (not tests): see docs/performance.md
#   make golden     regenerate golden/ (see golden/README.md)
#   make matrix     regenerate docs/detection-matrix.md from real --inject runs
#   make GPU=cuda   (or GPU=hip) the same with the GPU backend (docs/gpu.md)
#   make GPU=cuda gpu-check    GPU conformance, layouts, --inject, bench (SKIPPED without a GPU)
#   make GPU=cuda gpu-bundle   build/bundle: binaries + Open MPI runtime for a GPU machine
#   make GPU=cuda gpu-pack     build/gpu-pack: bundle + reference subset, compressed, < 60 MiB
#   make fuzz       libFuzzer harnesses tests/fuzz/fuzz_*.c, FUZZ_SECONDS each (tests/fuzz/README.md)
#   make sanitize   the test suite on an ASan + UBSan + LSan build in build-san/ (docs/reliability.md)
#   make sanitize-quick  the bounded subset CI runs
#   make valgrind   memcheck of one single-rank run (tests/valgrind.sh)
# Dependencies come from pkg-config and mpicc; nothing is hard-coded.

CC      := mpicc
PKGS    := openblas hdf5-openmpi libcjson
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
# oneDNN (libdnnl-dev): float32 GEMMs where OpenBLAS misdetects the CPU, the bf16 GEMM on AMX (sim/backend/fs_gemm.c). Debian's
# 2.6.3 ships no .pc file: pkg-config when there is one, else -ldnnl.
DNNL_LIBS  := $(shell pkg-config --exists dnnl 2>/dev/null && pkg-config --libs dnnl || echo -ldnnl)
PKG_LIBS   += $(DNNL_LIBS)
# STATIC_DEPS=1: OpenBLAS and HDF5 (with its szip/aec/zlib) from Debian's static archives, the
# rest (MPI, cJSON, gfortran) dynamic: the binaries tools/gpu/gpu-bundle.sh carries to a machine
# without those libraries (docs/gpu.md). Use with a separate build folder: B=build/static.
ifeq ($(STATIC_DEPS),1)
PKG_LIBS := $(shell pkg-config --libs-only-L $(PKGS)) -Wl,-Bstatic -lopenblas -lhdf5 -lsz -laec -lz -Wl,-Bdynamic \
            -lmpi -lcjson $(DNNL_LIBS) -lgfortran -lpthread -ldl
endif
CMOCKA_CFLAGS := $(shell pkg-config --cflags cmocka)
CMOCKA_LIBS   := $(shell pkg-config --libs cmocka)

OPT     ?= -O2
CFLAGS  ?= $(OPT) -g -march=x86-64-v2
# sim/ is layered, lowest first (docs/design.md; tools/ci/include-graph.py checks the arrows):
#   base -> backend -> parallel -> weights -> model -> run, and the CLI sim/main_flux_sim.c on top
SIM_DIRS := base backend parallel weights model run
INC      := $(addprefix -Isim/,$(SIM_DIRS)) -Ioracle
CFLAGS  += -fopenmp -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(INC) $(PKG_CFLAGS)
LDLIBS  := $(PKG_LIBS) -fopenmp -lm

B := build

# ---- GPU backend (docs/gpu.md): `make GPU=cuda` or `make GPU=hip`; plain `make` has none.
# One CUDA C++ source (sim/backend/gpu/*.cu) for both vendors; objects in build/gpu/, linked into
# libfluxsim.a; sim/backend/fs_backends.c (the registry) gets -DFS_WITH_GPU (and -DFS_GPU_HIP) to know the names.
GPU ?=
ifeq ($(GPU),cuda)
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
GPU_ARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
GPU_CXX   := $(NVCC) -O2 -std=c++17 $(GPU_ARCH) -Xcompiler -fPIC -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
GPU_NOFMA := -fmad=false
GPU_LIBS  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt -lpthread -lstdc++
GPU_DEFS  := -DFS_WITH_GPU
else ifeq ($(GPU),hip)
HIPCC     ?= hipcc
GPU_ARCH  ?= --offload-arch=gfx90a --offload-arch=gfx1030
GPU_CXX   := $(HIPCC) -x hip $(GPU_ARCH) -std=c++17 -O2 -fPIC -Wall -Wextra -Wno-unused-parameter
GPU_NOFMA := -ffp-contract=off
GPU_LIBS  := -lamdhip64 -lstdc++
GPU_DEFS  := -DFS_WITH_GPU -DFS_GPU_HIP
else ifneq ($(GPU),)
$(error GPU=$(GPU): expected GPU=cuda or GPU=hip (or nothing for the CPU-only build))
endif
GPU_OBJ  := $(if $(GPU),$(patsubst sim/backend/gpu/%.cu,$(B)/gpu/%.o,$(wildcard sim/backend/gpu/*.cu)))
GPU_HDRS := $(wildcard sim/backend/gpu/*.h) sim/backend/fs_backend.h sim/backend/fs_tensor.h sim/base/fs_common.h
# The build flavour: switching between GPU=cuda, GPU=hip and none rebuilds what depends on it.
GPU_STAMP := $(B)/.flavour-$(if $(GPU),$(GPU),cpu)
LDLIBS    += $(GPU_LIBS)

SIM_SRC    := $(foreach d,$(SIM_DIRS),$(wildcard sim/$(d)/*.c))
ORACLE_SRC := $(filter-out oracle/main_%.c,$(wildcard oracle/*.c))
LIB_OBJ    := $(patsubst %.c,$(B)/%.o,$(SIM_SRC) $(ORACLE_SRC))
LIB        := $(B)/libfluxsim.a
HDRS       := $(foreach d,$(SIM_DIRS),$(wildcard sim/$(d)/*.h sim/$(d)/*.inc)) $(wildcard oracle/*.h)

TEST_SRC   := $(wildcard tests/test_*.c)
TEST_BIN   := $(patsubst tests/%.c,$(B)/tests/%,$(TEST_SRC))
BENCH_SRC  := $(wildcard tools/bench/bench_*.c)
BENCH_BIN  := $(patsubst tools/bench/%.c,$(B)/%,$(BENCH_SRC))

.PHONY: all test unit integration bench golden matrix clean gpu-check gpu-bundle gpu-pack
ORACLE_MAIN := $(wildcard oracle/main_flux_oracle.c)
ORACLE_BIN  := $(if $(ORACLE_MAIN),$(B)/flux-oracle)
all: $(B)/flux-sim $(ORACLE_BIN) $(B)/make-checkpoint $(TEST_BIN) $(BENCH_BIN)

$(B)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# fs_rng.c and fs_weights_synth.c run fs_rng's exact definition (fs_rng.h, fs_rng_kernel.h):
# every multiply and add rounded on its own, never fused, whatever the ISA of the clone (and
# 1.0 + 0.1*z stays a multiply and an add); -fno-math-errno only lets sqrt vectorise (its argument
# is never negative); -O2's "very cheap" vectoriser cost model would leave their loops scalar.
RNG_CFLAGS := -ffp-contract=off -fno-math-errno -fvect-cost-model=dynamic
$(B)/sim/base/fs_rng.o $(B)/sim/weights/fs_weights_synth.o: CFLAGS += $(RNG_CFLAGS)

$(GPU_STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/.flavour-*
	@touch $@

$(B)/sim/backend/fs_backends.o: CFLAGS += $(GPU_DEFS)
$(B)/sim/backend/fs_backends.o: $(GPU_STAMP)

$(B)/gpu/%.o: sim/backend/gpu/%.cu $(GPU_HDRS) $(GPU_STAMP)
	@mkdir -p $(dir $@)
	$(GPU_CXX) $(GPU_EXTRA) -Isim/base -Isim/backend -c $< -o $@
# element-wise ops mirror the CPU kernels' roundings: no fused multiply-adds there
$(B)/gpu/fs_gpu_ops.o: GPU_EXTRA = $(GPU_NOFMA)

$(LIB): $(LIB_OBJ) $(GPU_OBJ) $(GPU_STAMP)
	@rm -f $@
	ar rcs $@ $(LIB_OBJ) $(GPU_OBJ)

$(B)/flux-sim: $(B)/sim/main_flux_sim.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(B)/flux-oracle: $(B)/oracle/main_flux_oracle.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# tools/gen/make_checkpoint.c: synthetic weights written as a real checkpoint (docs/scale.md)
$(B)/make-checkpoint: tools/gen/make_checkpoint.c $(LIB) $(HDRS)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

$(B)/tests/%: tests/%.c $(LIB) $(HDRS) tests/test_util.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CMOCKA_CFLAGS) $< $(LIB) -o $@ $(LDLIBS) $(CMOCKA_LIBS)

$(B)/bench_%: tools/bench/bench_%.c $(LIB) $(HDRS)
	$(CC) $(CFLAGS) $(GPU_DEFS) -O3 $< $(LIB) -o $@ $(LDLIBS)

# Tests need the CLIs built first (integration tests call them).
$(TEST_BIN): | $(B)/flux-sim $(ORACLE_BIN) $(B)/make-checkpoint

# Tests run from the repo root; they find ../shared/reference through FLUX_REFERENCE_DIR
# (default: ../shared/reference) and report SKIPPED loudly when it is absent.
test: all
	@tools/ci/run-tests.sh

bench: all
	@tools/bench/run-bench.sh

golden: $(B)/flux-sim
	@tools/gen/make-golden.sh

# Detection matrix (bug x layout -> first divergence) from real runs: docs/detection-matrix.md
matrix: all
	@tools/gen/detection-matrix.sh > docs/detection-matrix.md.tmp && mv docs/detection-matrix.md.tmp docs/detection-matrix.md
	@echo "wrote docs/detection-matrix.md"

# GPU conformance and runs (docs/gpu.md): per-op checks against the CPU backend, the reference
# configs, the layout matrix and the --inject table through --backend cuda|hip, and the forward
# throughput bench. Not part of `make test`; without a GPU it says SKIPPED and exits 0.
$(B)/gpu_check: tests/gpu/gpu_check.c $(LIB) $(HDRS) $(GPU_HDRS)
	$(CC) $(CFLAGS) $(GPU_DEFS) $< $(LIB) -o $@ $(LDLIBS)

gpu-check: $(B)/flux-sim $(ORACLE_BIN) $(B)/gpu_check $(B)/bench_forward
	@BACKEND=$(or $(BACKEND),$(if $(filter hip,$(GPU)),hip,cuda)) tools/gpu/gpu-check.sh

# flux-box: the four programs above in one executable (one copy of the static OpenBLAS/HDF5 in
# the GPU bundle); each main compiled from its own source with -Dmain=NAME_main.
BOX_OBJ := $(B)/box/flux_sim.o $(B)/box/flux_oracle.o $(B)/box/gpu_check.o $(B)/box/bench_forward.o
$(B)/box/flux_sim.o: sim/main_flux_sim.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Dmain=flux_sim_main -c $< -o $@
$(B)/box/flux_oracle.o: oracle/main_flux_oracle.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Dmain=flux_oracle_main -c $< -o $@
$(B)/box/gpu_check.o: tests/gpu/gpu_check.c $(HDRS) $(GPU_HDRS) $(GPU_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(GPU_DEFS) -Dmain=gpu_check_main -c $< -o $@
$(B)/box/bench_forward.o: tools/bench/bench_forward.c $(HDRS) $(GPU_HDRS) $(GPU_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(GPU_DEFS) -O3 -Dmain=bench_forward_main -c $< -o $@
$(B)/flux-box: tools/gpu/flux_box.c $(BOX_OBJ) $(LIB)
	$(CC) $(CFLAGS) $< $(BOX_OBJ) $(LIB) -o $@ $(LDLIBS)

# One relocatable folder (binaries + Open MPI runtime) for a GPU machine without MPI, OpenBLAS
# or HDF5: tools/gpu/gpu-bundle.sh (OUT=dir, default build/bundle).
gpu-bundle:
	@GPU=$(GPU) tools/gpu/gpu-bundle.sh

# the bundle + the reference subset, compressed, for the device tool (docs/gpu.md)
gpu-pack:
	@GPU=$(or $(GPU),cuda) tools/gpu/gpu-pack.sh

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
                $(INC) $(PKG_CFLAGS) $(shell mpicc --showme:compile)
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
	@FUZZ_DIR=$(FZ) tools/ci/run-fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

# ---- sanitizers (docs/reliability.md) -------------------------------------------------------
# `make sanitize`: everything rebuilt with ASan + UBSan (and float-cast-overflow, which gcc's
# -fsanitize=undefined leaves out) in build-san/, then the whole test suite run on those binaries
# (tools/ci/run-sanitize.sh: any ASan, UBSan or LeakSanitizer report fails it). ~18 minutes on 2 cores.
# OPT, not CFLAGS: a command-line CFLAGS would replace -fopenmp -Isim/... (see CFLAGS above).
SAN_B   := build-san
SAN_OPT := -O1 -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer
.PHONY: sanitize sanitize-build sanitize-quick valgrind
sanitize-build:
	$(MAKE) B=$(SAN_B) OPT="$(SAN_OPT)" all
sanitize: sanitize-build
	@FLUX_BUILD=$(SAN_B) tools/ci/run-sanitize.sh
# the bounded run CI does (~8 minutes): the input, error, fault and reader tests + the LSan mpirun pass
sanitize-quick: sanitize-build
	@FLUX_BUILD=$(SAN_B) FLUX_SANITIZE_QUICK=1 tools/ci/run-sanitize.sh

# valgrind of one single-rank run (memcheck, Open MPI suppressions): ~2 minutes, not in make test
valgrind: $(B)/flux-sim
	@FLUX_BUILD=$(B) bash tests/valgrind.sh
