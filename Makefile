# kvferry top-level entry points. See README.md.
#   make run    build (Release) and replay the bundled trace; prints a summary and the report path
#   make build  build only; the CLI is at build/kvferry
#   make test   build and run every test through CTest
#   make deps   install the Debian packages the build needs (idempotent)

BUILD ?= build
JOBS ?= $(shell nproc)
RUN_OUT ?= out/run

DEBIAN_PACKAGES := build-essential cmake pkg-config libucx-dev ucx-utils libzmq3-dev cppzmq-dev \
  libcpp-httplib-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libxxhash-dev \
  libgtest-dev libgmock-dev libbenchmark-dev python3

.PHONY: deps build run test clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600

clean:
	rm -rf $(BUILD) out
