# kvferry top-level entry points. See README.md.
#   make run    build (Release) and replay the bundled trace; prints a summary and the report path
#   make build  build only; the CLI is at build/kvferry
#   make test   build and run every test through CTest
#   make test-hog  the same with a CPU hog beside it: as many spinners as cores (HOG_CPUS), from
#               before ctest until after it, however it ends (tests/hog/hog.sh; docs/testing.md)
#   make faults build and replay with every fault kind mixed in, a rank killed and restarted
#               included: 500 requests over shm, 150 over tcp (out/faults/{shm,tcp}/report.json)
#   make test-sanitize  the same under ASan+LSan+UBSan in build-asan (slow; not part of `make test`;
#               docs/testing.md)
#   make test-sanitize-ci  CI's sanitizer step (.ci/run, after fuzz-smoke): build-asan, every unit test and the
#               integration subset SANITIZE_CI_TESTS (docs/testing.md, "Sanitizers in CI")
#   make test-tsan  the unit tests only, built with ThreadSanitizer in build-tsan (not in CI;
#               docs/testing.md, "ThreadSanitizer")
#   make bench  build and run bench/compare.sh: kvferry bench vs ucx_perftest and memcpy, control
#               plane, failure path, micro-benchmarks (under 10 min); raw results in out/bench/,
#               plots by bench/plot.sh; last line: the ratios (docs/BENCHMARKS.md)
#   make run-hosts  build, bring up 2 test hosts (network namespaces, tests/hosts/hosts.sh; needs
#               root), replay the bundled trace 2+2 over tcp with prefill on one host and decode on
#               the other (out/run-hosts/report.json), and take the hosts down again
#   make fuzz   build the libFuzzer targets (clang, build-fuzz/) and run each for FUZZ_SECONDS
#               (default 60) from its seed corpus fuzz/corpus/<target>/; a crash stops it with the
#               input in build-fuzz/artifacts/<target>/ (docs/testing.md, "Fuzzing")
#   make fuzz-smoke  the same, 30 s each (the short slot for CI)
#   make deps   install the Debian packages the build needs (idempotent)

BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := control_codec am_wire shard_address remote_info engine_sync router_protocol \
  rank_info_json sglang_routes trace endpoint_address rkey_unpack request_mac
JOBS ?= $(shell nproc)
RUN_OUT ?= out/run
FAULTS_OUT ?= out/faults
BENCH_OUT ?= out/bench
RUN_HOSTS_OUT ?= out/run-hosts
# `make run-hosts`: the test hosts' names (namespaces RUN_HOSTS_PREFIXh1, h2, bridge ...br) and
# subnet (tests/hosts/hosts.sh).
RUN_HOSTS_PREFIX ?= kvrun
RUN_HOSTS_SUBNET ?= 10.70.0
RUN_HOSTS_REQUESTS ?= 20
# `make faults`: every kind (docs/report.md "Faults"); injected timeouts fire after 500 ms, every
# other deadline has its default (include/kvferry/deadlines.h).
# The Azure trace's sizes, its arrivals re-paced to one request per FAULTS_GAP_MS (the recorded ones
# come in bursts far above this machine's rate, so a killed rank would meet a backlog of requests).
FAULT_PLAN ?= transfer@prefill:0.02,transfer@decode:0.02,decode_fail:0.02,timeout@prefill:0.02,timeout@decode:0.02,abort:0.02
FAULTS_GAP_MS ?= 200
FAULT_ARGS := --trace $(FAULTS_OUT)/azure_paced.jsonl --model Qwen2.5-7B --prefill-tp 2 --decode-tp 2 \
  --pool-mib 2048 --prefill-pool-mib 256 --page-size 16 --seed 1 --fault-timeout-ms 500

DEBIAN_PACKAGES := nftables build-essential cmake pkg-config libucx-dev ucx-utils libzmq3-dev cppzmq-dev \
  libcpp-httplib-dev libsodium-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libxxhash-dev \
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-dev pybind11-dev python3-pytest \
  python3-numpy python3-venv python3-pip python3-setuptools python3-wheel gnuplot-nox jq stress-ng iproute2 clang \
  libclang-rt-14-dev

.PHONY: deps build run run-hosts faults bench test test-hog sanitize-configure test-sanitize test-sanitize-ci \
  test-tsan fuzz fuzz-build fuzz-smoke clean

deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/kvferry replay --trace data/traces/conversation_trace.jsonl --model Llama-3.1-8B \
	  --prefill-tp 2 --decode-tp 2 --pool-mib 6656 --prefill-pool-mib 1024 --page-size 64 \
	  --max-requests 200 --time-scale 0 --fault-rate 0.02 --seed 1 --transport shm --out $(RUN_OUT)

# The hosts go down again however the replay ends (trap on EXIT, also on Ctrl-C).
run-hosts: build
	mkdir -p $(RUN_HOSTS_OUT)
	trap 'tests/hosts/hosts.sh down $(RUN_HOSTS_PREFIX)' EXIT; \
	KVF_HOSTS_SUBNET=$(RUN_HOSTS_SUBNET) tests/hosts/hosts.sh up 2 $(RUN_HOSTS_PREFIX) \
	  --prefill h1,h1 --decode h2,h2 --json $(RUN_HOSTS_OUT)/hosts.json && \
	$(BUILD)/kvferry replay --trace data/traces/conversation_trace.jsonl --model Llama-3.1-8B \
	  --prefill-tp 2 --decode-tp 2 --pool-mib 6656 --prefill-pool-mib 1024 --page-size 64 \
	  --max-requests $(RUN_HOSTS_REQUESTS) --time-scale 0 --fault-rate 0.02 --seed 1 --transport tcp \
	  --hosts $(RUN_HOSTS_OUT)/hosts.json --out $(RUN_HOSTS_OUT)

$(FAULTS_OUT)/azure_paced.jsonl: data/traces/AzureLLMInferenceTrace_code.csv
	mkdir -p $(FAULTS_OUT)
	awk -F, 'NR > 1 && NR <= 501 { printf "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": %d, \"hash_ids\": []}\n", (NR - 2) * $(FAULTS_GAP_MS), $$2, $$3 }' $< > $@

faults: build $(FAULTS_OUT)/azure_paced.jsonl
	$(BUILD)/kvferry replay $(FAULT_ARGS) --max-requests 500 --time-scale 1 --transport shm \
	  --faults $(FAULT_PLAN),peer_death@prefill/tp1:once --out $(FAULTS_OUT)/shm
	$(BUILD)/kvferry replay $(FAULT_ARGS) --max-requests 150 --time-scale 2 --transport tcp \
	  --faults $(FAULT_PLAN),peer_death@decode/tp0:once --out $(FAULTS_OUT)/tcp

bench: build
	bench/compare.sh $(BUILD) $(BENCH_OUT)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600

# `make test` beside a CPU hog: busy is not dead (docs/testing.md, "Under load"). A subset:
# make test-hog CTEST_ARGS="-R Replay".
test-hog: build
	tests/hog/hog.sh sh -c 'cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600 $(CTEST_ARGS)'

# Sanitizer options and suppressions are compiled into every executable (tests/sanitizers/).
sanitize-configure: deps
	cmake -S . -B $(ASAN_BUILD) -DKVFERRY_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo

test-sanitize: sanitize-configure
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j 2 --timeout 1200

# CI's sanitizer step: every unit test (CTest label `unit`), then the multi-process tests of
# SANITIZE_CI_TESTS (label `integration`): failure paths across real processes whose checks wait
# for events under deadlines, no wall-clock window. Both runs always happen; either failing fails
# the step. Why these and not the others: docs/testing.md, "Sanitizers in CI". Only what they
# need is built (SANITIZE_CI_TARGETS: the unit tests, the CLI the multi-process tests start, and
# the binaries holding the subset).
SANITIZE_CI_TESTS := ^(Replay\.(TcpOneByOneWithFaults|RankThatCannotStartStopsTheReplay|RankKilledMidRunStopsTheReplay|SigtermStopsEveryProcess)|Observability\.CtrlCStopsEveryProcessAndWritesAPartialReport|RankSigterm\.DebugLinesAndTheStopReachTheLogFile)$$|^SilentRank/PrefillFail\.OnASendingAndANonSendingRankFailsTheRoomEverywhere/DeepSeek_4x2( |$$)
SANITIZE_CI_TARGETS := kvferry_unit_tests kvferry_cli replay_test observability_test hetero_tp_test \
  rank_sigterm_test
test-sanitize-ci: sanitize-configure
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(SANITIZE_CI_TARGETS)
	@cd $(ASAN_BUILD) && rc=0; \
	ctest --output-on-failure -j 2 --timeout 1200 --no-tests=error -L '^unit$$' || rc=1; \
	ctest --output-on-failure --timeout 1200 --no-tests=error -L '^integration$$' -R '$(SANITIZE_CI_TESTS)' || rc=1; \
	exit $$rc

# ThreadSanitizer (not in CI): only unit test binaries are built (TSAN_TARGETS, default all of them)
# and run (label `unit`; narrow with CTEST_ARGS="-R ..."). Options and suppressions:
# tests/sanitizers/tsan_defaults.cc, tsan.supp. A test whose binary was not built is not run.
# UCX_MEM_EVENTS=no: UCX's memory hooks (libucm patches mmap/munmap/brk in every process that
# links UCX) crash a TSan-built process at once (SIGSEGV before main's first test).
TSAN_TARGETS ?= kvferry_unit_tests
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DKVFERRY_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TARGETS)
	cd $(TSAN_BUILD) && UCX_MEM_EVENTS=no ctest --output-on-failure -j 2 --timeout 1200 -L '^unit$$' $(CTEST_ARGS)

# libFuzzer targets (fuzz/CMakeLists.txt): a clang build of only them and the decoders they test.
# New inputs go to build-fuzz/corpus/<target>/ (the committed seeds in fuzz/corpus/ are read only);
# every target runs even when one finds a crash, and the status is non-zero if any did.
fuzz-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DKVFERRY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target kvferry_fuzzers

fuzz: fuzz-build
	@failed=""; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t $(FUZZ_BUILD)/artifacts/$$t; \
	  echo "== $$t ($(FUZZ_SECONDS) s)"; \
	  $(FUZZ_BUILD)/fuzz/$${t}_fuzz -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$t/ $(FUZZ_BUILD)/corpus/$$t fuzz/corpus/$$t \
	    > $(FUZZ_BUILD)/$$t.log 2>&1 || { failed="$$failed $$t"; tail -n 40 $(FUZZ_BUILD)/$$t.log; }; \
	  grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' $(FUZZ_BUILD)/$$t.log; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: crashes in:$$failed (logs $(FUZZ_BUILD)/<target>.log)"; exit 1; fi

fuzz-smoke:
	$(MAKE) fuzz FUZZ_SECONDS=30

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) out
