# ditrun — build, test, sanitize, fuzz.
#   make            build/ditrun and build/libditrun.a, and the CUDA backend plugin build/libditrun_cuda.so when
#                   nvcc is found (loaded at run time only when a CUDA backend is asked for: backends/cuda_plugin.h)
#   make test       every test; ends with "N passed, N failed" (GPU tests skip without a GPU)
#   make test-gpu   the same, but GPU tests must run (fail if no GPU)
#   make test-asan  tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU build)
#   make fuzz       libFuzzer targets (clang) in build/fuzz/
#   make dev        the kernel studies and tools of dev/ in build/dev/ (run by hand on a GPU machine; not tests)
#   make CUDA=0     force a CPU-only build
#   make CUDA_ARCHS="90a"  the CUDA plugin for these cards only (default: 80 86 89 90a 100 120, see below)
#   make install    PREFIX (default /usr/local), DESTDIR: bin/ditrun, lib/ditrun/libditrun_cuda.so (the CUDA plugin,
#                   found by the program in ../lib/ditrun/), lib/libditrun.a, include/ditrun.h
CC      ?= cc
BUILD   ?= build
CFLAGS  ?= -O2 -g
override CFLAGS  += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Isrc -Iinclude -MMD -MP
ifeq ($(STATIC_CPU_LIBS),1)
  # for machines without these -dev packages (the GPU machine): link them into the binaries
  # (Debian's libmicrohttpd.a calls GnuTLS for HTTPS, which the server never uses: GnuTLS stays a shared library,
  # libgnutls.so.30, present wherever apt is)
  LDLIBS  += $(EXTRA_LDFLAGS) -Wl,-Bstatic -lopenblas -lpng -ljpeg -lwebpmux -lwebp -lz -lutf8proc -lmicrohttpd -Wl,-Bdynamic -lgnutls -lm -pthread
else
  LDLIBS  += $(EXTRA_LDFLAGS) -lopenblas -lpng -ljpeg -lwebpmux -lwebp -lz -lutf8proc -lmicrohttpd -lm -pthread
endif
# EXTRA_CFLAGS / EXTRA_LDFLAGS: extra include and library folders (e.g. a machine without libutf8proc-dev:
#   make EXTRA_CFLAGS=-I.devdeps/include EXTRA_LDFLAGS=-L.devdeps/lib)
override CFLAGS += $(EXTRA_CFLAGS)

NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
LIB_C  := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_C  := $(shell find src/cli -name '*.c' | sort)
CU_SRC := $(shell find src/backends/cuda -name '*.cu' 2>/dev/null | sort)
CUDA ?= $(if $(and $(NVCC),$(CU_SRC)),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
TEST_C := $(shell find tests -maxdepth 1 -name 'test_*.c' | sort)
TEST_SUPPORT_C := $(filter-out $(TEST_C),$(shell find tests -maxdepth 1 -name '*.c' | sort))
DEV_C  := $(shell find dev -maxdepth 1 -name '*.c' 2>/dev/null | sort)

# Programs hold the whole libditrun.a and export the core's functions, which the CUDA plugin calls.
PLUGIN_HOST_LDFLAGS := -Wl,--whole-archive $(BUILD)/libditrun.a -Wl,--no-whole-archive \
    '-Wl,--export-dynamic-symbol=dt_*' '-Wl,--export-dynamic-symbol=st_*' \
    '-Wl,--export-dynamic-symbol=json_*' '-Wl,--export-dynamic-symbol=mlx_*'

ifeq ($(CUDA),1)
  # CUDA_ARCHS: the cards the plugin carries machine code (SASS) for, oldest first, each kept only where this nvcc
  # lists it (nvcc --list-gpu-code), plus PTX of the last one (compiled by the driver on newer cards). The default
  # covers Ampere (80, 86), Ada (89), Hopper (90a: our wgmma / TMA kernels) and Blackwell (100, 120), 2-3x the
  # compile time of one target (NOTES.md); a developer's build for one card: make CUDA_ARCHS=90a (README: GPUs).
  CUDA_ARCHS ?= 80 86 89 90a 100 120
  NVCC_CODES := $(shell $(NVCC) --list-gpu-code 2>/dev/null)
  CUDA_ARCHS_BUILT := $(foreach a,$(CUDA_ARCHS),$(if $(filter sm_$(patsubst %a,%,$(a)),$(NVCC_CODES)),$(a)))
  ifeq ($(strip $(CUDA_ARCHS_BUILT)),)
    $(error CUDA_ARCHS="$(CUDA_ARCHS)": none is supported by $(NVCC) ($(NVCC_CODES)))
  endif
  NVCCFLAGS ?= -O3 -std=c++17 -lineinfo
  NVCCFLAGS += $(foreach a,$(CUDA_ARCHS_BUILT),-gencode=arch=compute_$(a),code=sm_$(a)) \
               -gencode=arch=compute_$(lastword $(CUDA_ARCHS_BUILT)),code=compute_$(lastword $(CUDA_ARCHS_BUILT)) \
               -Isrc -I$(BUILD)/gen -Xcompiler -Wall,-fPIC --expt-relaxed-constexpr -MMD -MP
  override CFLAGS += -DDT_HAVE_CUDA=1 -I$(BUILD)/gen
  LDLIBS  += -ldl
  # the plugin: every .cu object, its CUDA libraries found through its own run path; references to its own
  # functions bound inside it (the programs export functions of the same names: backends/cuda_loader.c)
  PLUGIN_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++ -ldl -lm -pthread
  CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
  PLUGIN  := $(BUILD)/libditrun_cuda.so
else
  CU_OBJ  :=
  PLUGIN  :=
endif

# the web page of `ditrun serve` (src/serve/web/index.html), a C array generated at build time
PAGE_C   := $(BUILD)/gen/serve_page_html.c
LIB_OBJ  := $(LIB_C:%.c=$(BUILD)/%.o) $(PAGE_C:.c=.o)
CLI_OBJ  := $(CLI_C:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_C:tests/%.c=$(BUILD)/tests/%)
DEV_BIN  := $(DEV_C:dev/%.c=$(BUILD)/dev/%)
TEST_SUPPORT_OBJ := $(TEST_SUPPORT_C:%.c=$(BUILD)/%.o)
# ABI tag shared by the programs and the plugin: a checksum of every header (a stale plugin is refused)
ABI_HDRS := $(shell find src include -name '*.h' | sort)

.PHONY: all test test-gpu test-asan fuzz clean tests golden install dev
all: $(BUILD)/ditrun $(BUILD)/libditrun.a $(PLUGIN)

$(BUILD)/libditrun.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/ditrun: $(CLI_OBJ) $(BUILD)/libditrun.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(PLUGIN_HOST_LDFLAGS) $(LDLIBS)

$(BUILD)/libditrun_cuda.so: $(CU_OBJ)
	$(CC) -shared -Wl,-Bsymbolic-functions -o $@ $(CU_OBJ) $(EXTRA_LDFLAGS) $(PLUGIN_LDLIBS)

$(BUILD)/gen/dt_abi.h: $(ABI_HDRS)
	@mkdir -p $(@D)
	@echo "#define DT_ABI_TAG \"$$(cat $^ | cksum | cut -d' ' -f1)\"" > $@

$(BUILD)/src/backends/cuda_loader.o $(BUILD)/src/backends/cuda/cuda_plugin.o: $(if $(PLUGIN),$(BUILD)/gen/dt_abi.h)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(PAGE_C): src/serve/web/index.html
	@mkdir -p $(@D)
	{ echo '/* generated by the Makefile from $< */'; echo '#include <stddef.h>'; \
	  echo 'const unsigned char dt_serve_page_html[] = {'; od -An -v -tx1 $< | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '0x00};'; echo "const size_t dt_serve_page_html_len = $$(wc -c < $<);"; } > $@.tmp && mv $@.tmp $@

$(PAGE_C:.c=.o): $(PAGE_C)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT_OBJ) $(BUILD)/libditrun.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(TEST_SUPPORT_OBJ) $(PLUGIN_HOST_LDFLAGS) $(LDLIBS)

tests: $(TEST_BIN) $(BUILD)/ditrun $(PLUGIN)

# dev/: one program per kernel study (tests/gpu_ops.h's helpers) and small tools such as stcmp
$(BUILD)/dev/%: dev/%.c $(BUILD)/libditrun.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(PLUGIN_HOST_LDFLAGS) $(LDLIBS)

dev: $(DEV_BIN) $(PLUGIN)

test: tests
	@BUILD=$(BUILD) sh tests/run_tests.sh

test-gpu: tests
	@DITRUN_REQUIRE_GPU=1 BUILD=$(BUILD) sh tests/run_tests.sh

test-asan:
	$(MAKE) BUILD=build-asan CUDA=0 CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" tests
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 BUILD=build-asan sh tests/run_tests.sh

fuzz:
	@sh fuzz/build.sh

# Re-record the golden image of the bundled tiny model (tests/test_generate.c compares byte for byte).
golden: $(BUILD)/ditrun
	OPENBLAS_CORETYPE=Prescott $(BUILD)/ditrun generate --backend cpu -q --threads 2 --model tests/fixtures/model --prompt 'a red fox standing in fresh snow, golden hour' \
	  --seed 7 --height 64 --width 64 --max-sequence-length 32 --output tests/golden/tiny-seed7.png
	echo "glibc $$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)" > tests/golden/tiny-seed7.platform

# make install [PREFIX=/usr/local] [DESTDIR=]: the command, the library and its header, the CUDA plugin, and the
# bundled tiny model
# (share/ditrun/model: the default --model of generate and serve, and the tokenizer synth --pipeline copies).
PREFIX ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/share/ditrun
	install -m 755 $(BUILD)/ditrun $(DESTDIR)$(PREFIX)/bin/ditrun
	install -m 644 $(BUILD)/libditrun.a $(DESTDIR)$(PREFIX)/lib/libditrun.a
	install -m 644 include/ditrun.h $(DESTDIR)$(PREFIX)/include/ditrun.h
	rm -rf $(DESTDIR)$(PREFIX)/share/ditrun/model && cp -R tests/fixtures/model $(DESTDIR)$(PREFIX)/share/ditrun/model
	$(if $(PLUGIN),install -d $(DESTDIR)$(PREFIX)/lib/ditrun && install -m 755 $(PLUGIN) $(DESTDIR)$(PREFIX)/lib/ditrun/)

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
