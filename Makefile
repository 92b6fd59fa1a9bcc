# podgate — build, demo, tests.
#
#   make demo    podgate's mission on a real containerd and API server: governed pulls, DRA before
#                CNI, sysctls, PodResources; a timeline of each pod start (root). Builds only what
#                it uses (make rig-node rig-control-plane), not the kubelet nor crictl/grpcurl
#   make test    lint + all tests with -race; the end-to-end tests run when root, on the newest
#                kubelet and containerd of the tested matrix, and their core again on the oldest
#                pair (the skew lane, test/matrix)
#   make matrix  the core of the real-stack tests on every kubelet × containerd cell of the tested
#                matrix (test/matrix/versions.env); prints the "Tested with" table (root)
#   make unit    the inner loop: the unit tests (not the real-stack ones under test/), no root,
#                rig nor lint
#   make bench   benchmarks: direct vs. through podgate (see BENCHMARKS.md)
#   make attacks the hostile local clients of issues 30, 38 and 47 against podgate and grpc-go:
#                RSS, the kubelet's Version answered, what each server did, whether podgate held
#                what TestAttacks checks; the write path's stress test; a table (test/hostile; root)
#   make h2spec  h2spec v2.2.1 with gRPC-shaped requests against podgate and grpc-go (also with
#                podgate's stream limit), side by side
#                (test/h2spec; root)
#   make vm-test the VM lane: a Debian 12 node with systemd, cgroup v2 and the systemd cgroup driver
#                booted under qemu; podgate from its .deb under systemd, the kubelet through it,
#                upgrade, stop/start, memory QoS, resizes, removal (test/vm; root; 10 minutes here
#                with the image built, which takes 7 more the first time)
#   make soak    SOAK_N (1000) pod lifecycles through podgate, through a real kubelet when the cluster
#                is installed (SOAK_MODE auto; kubelet, cri); flat RSS/goroutines/fds, no leftovers (root)
#   make generate         lint the .proto files and generate their Go code (buf, pinned plugins)
#   make verify-generate  generate, then fail if the committed generated code differs
#   make package    .deb and .rpm of the static binary for amd64 and arm64 (nfpm, pinned), with the
#                   unit, the config and kubelet drop-in as conffiles, and the docs, in
#                   $(RELEASE_DIR); PKG_VERSION, PKG_ARCHES (docs/runbook.md, "Install from the
#                   package")
#   make release    package, then a CycloneDX SBOM of each binary (cyclonedx-gomod, pinned) and
#                   SHA256SUMS over the binaries, SBOMs and packages
#   make install    the binary, the systemd unit, a commented default config (kept if present) and
#                   the kubelet drop-in, under $(DESTDIR); PREFIX (default /usr/local) for the binary
#   make uninstall  remove what install put, but the config file
#   make clean-rig  remove the rig (/var/lib/podgate-rig); Debian packages stay

SHELL   := /bin/bash
GO      ?= go
BIN     := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# COMMIT is stamped with -X main.commit for `podgate version` when go build stamps no
# vcs.revision (a git worktree, whose .git go build does not read; GOFLAGS=-buildvcs=false).
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell [ -n "$$(git status --porcelain 2>/dev/null)" ] && echo -dirty)
# -buildvcs=auto: stamp vcs.revision where go build can, whatever GOFLAGS says.
BUILD_FLAGS := -buildvcs=auto -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)"
GOLANGCI_LINT_VERSION := v2.15.0
NFPM_VERSION          := v2.45.2
CYCLONEDX_GOMOD_VERSION := v1.10.0
BENCHSTAT_VERSION     := v0.0.0-20260908200009-22c9c6c9d4da
BUF_VERSION           := v1.75.0
# protoc-gen-go is the version of google.golang.org/protobuf in go.mod: keep them together.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
IS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo yes)

export PATH := /usr/local/go/bin:$(PATH)

.PHONY: all build package release demo test matrix unit lint rig rig-node rig-control-plane rig-cluster rig-tools rig-neighbours bench attacks h2spec soak vm-test generate verify-generate install uninstall clean clean-rig

PREFIX  ?= /usr/local
DESTDIR ?=
UNIT_DIR      := $(DESTDIR)/etc/systemd/system
CONFIG_FILE   := $(DESTDIR)/etc/podgate/config.yaml
KUBELET_DROPIN := $(DESTDIR)/etc/kubernetes/kubelet.conf.d/50-podgate.conf

all: build

# build: a static binary (CGO_ENABLED=0). podgate uses cgo only through the standard library's
# net and os/user, whose pure-Go paths it can do with (host names from /etc/hosts and DNS, socket
# groups from /etc/group); linked against libc, the loader's and libc's pages are ≈ 1.3-1.9 MiB
# more resident memory on every node (BENCHMARKS.md, "The tail and the memory together").
build:
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/podgate ./cmd/podgate

# package: per architecture, the static binary (-trimpath: no build machine's paths in it), the
# unit with ExecStart=/usr/bin/podgate, then nfpm (deploy/package/nfpm.yaml) for the .deb and the
# .rpm. PKG_VERSION is the package's version, made of VERSION by deploy/package/version.sh.
RELEASE_DIR ?= $(BIN)/release
PKG_ARCHES  ?= amd64 arm64
PKG_VERSION ?= $(shell sh deploy/package/version.sh '$(VERSION)')
package: $(BIN)/nfpm
	@set -e; for arch in $(PKG_ARCHES); do \
		stage=$(RELEASE_DIR)/stage-$$arch; mkdir -p $$stage; \
		echo "podgate $(PKG_VERSION) linux/$$arch"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath $(BUILD_FLAGS) -o $(RELEASE_DIR)/podgate-linux-$$arch ./cmd/podgate; \
		cp $(RELEASE_DIR)/podgate-linux-$$arch $$stage/podgate; \
		sed 's|^ExecStart=/usr/local/bin/podgate |ExecStart=/usr/bin/podgate |' deploy/podgate.service > $$stage/podgate.service; \
		cp -R deploy/config.yaml deploy/kubelet-podgate.conf README.md docs deploy/package/deb deploy/package/rpm $$stage/; \
		mkdir -p $$stage/monitoring; cp deploy/monitoring/podgate-*.yaml deploy/monitoring/podgate-*.json $$stage/monitoring/; \
		for p in deb rpm; do \
			(cd $$stage && GOARCH=$$arch PKG_VERSION='$(PKG_VERSION)' \
				$(BIN)/nfpm package --config $(CURDIR)/deploy/package/nfpm.yaml --packager $$p --target $(abspath $(RELEASE_DIR))/); \
		done; \
		rm -rf $$stage; \
	done

# release: the packages, a CycloneDX SBOM (JSON) of each binary's modules as go version -m reads
# them, and SHA256SUMS (sha256sum -c SHA256SUMS checks a download).
release: package $(BIN)/cyclonedx-gomod
	@set -e; for arch in $(PKG_ARCHES); do \
		$(BIN)/cyclonedx-gomod bin -json -version $(VERSION) -output $(RELEASE_DIR)/podgate-linux-$$arch.cdx.json $(RELEASE_DIR)/podgate-linux-$$arch; \
	done
	cd $(RELEASE_DIR) && sha256sum $(foreach a,$(PKG_ARCHES),podgate-linux-$(a) podgate-linux-$(a).cdx.json) *.deb *.rpm > SHA256SUMS
	@cat $(RELEASE_DIR)/SHA256SUMS

# rig: everything the tests use (root; idempotent, reuses what is built), in parts
# (test/rig/install.sh): rig-node is containerd, runc, CNI plugins and the test images;
# rig-control-plane etcd and kube-apiserver; rig-cluster those and the kubelet; rig-tools crictl
# and grpcurl; rig-neighbours multus, dra-example-driver and dranet (test/rig/neighbours.env).
rig:
	bash test/rig/install.sh
rig-node:
	bash test/rig/install.sh node
rig-control-plane:
	bash test/rig/install.sh control-plane
rig-cluster:
	bash test/rig/install.sh cluster
rig-tools:
	bash test/rig/install.sh tools
rig-neighbours:
	bash test/rig/install.sh neighbours

# demo: the parts of the rig it uses, then the demo (test/demo); DEMO_OUT holds its timeline
# picture and logs.
DEMO_OUT ?= _output/demo
demo: rig-node rig-control-plane
	$(GO) run ./test/demo -out $(DEMO_OUT)

SOAK_N ?= 1000
SOAK_MODE ?= auto
soak: rig
	$(GO) run ./test/soak -n $(SOAK_N) -mode $(SOAK_MODE) -out _output/soak

# vm-test: the VM lane (test/vm, issue 41). The rig's node, tools and cluster parts and the VM's
# node image (install.sh's vm part: built once, about 7 minutes, then reused), the amd64 .deb, then
# one boot of the VM running the node tests inside (test/vm/vm-test.sh; results in
# $(VM_OUT)). Bounded: the VM is killed after VM_TIMEOUT seconds (test/vm/run.sh).
VM_OUT ?= _output/vm
vm-test:
	@[ "$$(id -u)" = 0 ] || { echo "make vm-test: needs root (apt-get, debootstrap, qemu)"; exit 1; }
	bash test/rig/install.sh node tools cluster vm
	$(MAKE) package PKG_ARCHES=amd64
	bash test/vm/vm-test.sh $(VM_OUT)

# test: everything. As root the real-stack rig is installed first so the e2e tests run;
# otherwise they skip with a message saying so. test/promql is a module of its own (Prometheus'
# PromQL parser, kept out of podgate's go.mod): it checks deploy/monitoring's queries. verify-generate checks the committed generated
# code is what the pinned generators make of the .proto files. -timeout bounds each package:
# test/cluster, the longest, took 18 minutes under -race on two cores (2026-11-29).
test: lint verify-generate $(if $(IS_ROOT),rig)
	$(GO) test -race -count=1 -shuffle=on -timeout 45m ./...
	cd test/promql && $(GO) test -race -count=1 -shuffle=on ./...
ifeq ($(IS_ROOT),yes)
	bash test/matrix/run.sh skew
endif

# matrix: every kubelet × containerd release of the tested matrix built beside the default ones
# (about 5 minutes per kubelet, 2 per containerd, the first time), then the core of the real-stack
# tests on each cell (test/matrix/run.sh).
matrix:
	@[ "$$(id -u)" = 0 ] || { echo "make matrix: needs root (the rig runs containerd and kubelets)"; exit 1; }
	bash test/rig/install.sh node cluster tools matrix
	bash test/matrix/run.sh all
	$(MAKE) vm-test

# unit: the inner loop, every package but the real-stack ones under test/ (they need the rig),
# without lint, the rig or root. None of them uses the rig; the tests that need root (network
# namespaces, cgroups) skip without it, and run as root. -short leaves out the tests that cost
# tens of CPU-seconds (the 30,000-container rebuild) or wait out client-go's backoff in real
# time (the kubelet Pods API's fallback and restart). Without -race by default, the faster: on
# the idle 2-core test machine with the build cache warm, make unit took 50 s (70 CPU-seconds);
# shared with other builds and tests it took 68-113 s before. make test runs everything with
# -race; for it here: make unit UNIT_FLAGS=-race.
UNIT_FLAGS ?=
unit:
	$(GO) test $(UNIT_FLAGS) -count=1 -short $$($(GO) list ./... | grep -v '^github.com/podgate/podgate/test/')

# lint also builds for darwin, so that the code still builds off Linux (a developer's Mac):
# Linux-only code goes in _linux.go files with an _other.go beside them. The product's unit tests
# are compiled for darwin too (vet compiles test files); the real-stack tests under test/ are not:
# they need Linux, root and the rig's containerd, runc and CNI, and cannot run anywhere else.
lint: $(BIN)/golangci-lint
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd test/promql && $(GO) vet ./...
	GOOS=darwin $(GO) build ./...
	GOOS=darwin $(GO) vet $$(GOOS=darwin $(GO) list ./... | grep -v '^github.com/podgate/podgate/test/')
	$(BIN)/golangci-lint run ./...

$(BIN)/golangci-lint:
	GOBIN=$(BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

$(BIN)/nfpm:
	GOBIN=$(BIN) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)

$(BIN)/cyclonedx-gomod:
	GOBIN=$(BIN) $(GO) install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION)

$(BIN)/benchstat:
	GOBIN=$(BIN) $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)

# bench: the proxy's and the pull governor's cost, each against the direct path in one run;
# benchstat prints the podgate (or governor) column relative to direct.
bench: $(BIN)/benchstat
	$(GO) test -run '^$$' -bench . -count 6 ./cri ./cri/imagepull | tee bench.txt
	$(BIN)/benchstat -col /path bench.txt

# attacks: the hostile clients of issues 30, 38 and 47 and the write path's stress test, each
# against fresh processes (test/hostile).
attacks:
	$(GO) run ./test/hostile

# h2spec: conformance with gRPC-shaped requests, podgate beside grpc-go (test/h2spec/run.sh).
h2spec:
	GO=$(GO) test/h2spec/run.sh

# generate: the Go code of the .proto files (buf.yaml, buf.gen.yaml), next to each .proto.
# $(BIN) comes first in PATH so buf runs the pinned plugins, not whatever else is installed.
PROTO_TOOLS := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
generate: $(PROTO_TOOLS)
	PATH="$(BIN):$$PATH" $(BIN)/buf lint
	PATH="$(BIN):$$PATH" $(BIN)/buf generate

# verify-generate: for CI, the committed generated code must be what `make generate` makes.
verify-generate: generate
	@changed=$$(git status --porcelain -- podresources/api); \
	if [ -n "$$changed" ]; then \
		echo "podresources/api differs from the commit after make generate (generated code out of date, or uncommitted changes): run 'make generate' and commit the result:"; \
		echo "$$changed"; git --no-pager diff --stat -- podresources/api; exit 1; \
	fi

$(BIN)/buf:
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# install: where a node keeps them. The unit's ExecStart follows PREFIX; an existing config file
# is kept (the operator's); then: systemctl daemon-reload && systemctl enable --now podgate,
# and restart the kubelet to pick up the drop-in (README, "Adopting podgate on a running node").
install: build
	install -D -m 0755 $(BIN)/podgate $(DESTDIR)$(PREFIX)/bin/podgate
	install -d -m 0755 $(UNIT_DIR)
	sed 's|^ExecStart=/usr/local/bin/podgate |ExecStart=$(PREFIX)/bin/podgate |' deploy/podgate.service > $(UNIT_DIR)/podgate.service
	chmod 0644 $(UNIT_DIR)/podgate.service
	@if [ -e $(CONFIG_FILE) ]; then echo "keeping $(CONFIG_FILE)"; else install -D -m 0644 deploy/config.yaml $(CONFIG_FILE); fi
	install -D -m 0644 deploy/kubelet-podgate.conf $(KUBELET_DROPIN)

# uninstall: the config file stays (remove /etc/podgate yourself); stop podgate and restart the
# kubelet first, so that it talks to containerd again.
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/podgate $(UNIT_DIR)/podgate.service $(KUBELET_DROPIN)
	@echo "kept $(CONFIG_FILE)"

clean:
	rm -rf $(BIN) bench.txt

# clean-rig: remove what `make rig` built (containerd, runc, images, cluster binaries, crictl,
# grpcurl, the neighbours).
# The Debian packages test/rig/install.sh installed stay: other software may use them.
RIG_DIR := $(or $(PODGATE_RIG_DIR),/var/lib/podgate-rig)
clean-rig:
	rm -rf $(RIG_DIR)
