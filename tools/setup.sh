#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine (run as root, or with sudo available).
# Installs the Debian packages Tandem builds against, the npm packages its tests use,
# and the bundled demo model (verified by sha256). Safe to run again: it only does what
# is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential g++ pkg-config meson ninja-build python3
  ccache                          # compiler cache: meson uses it for both builds (build/, build-san/)
  libcaf-dev                      # CAF 0.17.6: actors (core + io)
  capnproto libcapnp-dev          # Cap'n Proto + KJ: wire format, kj-http servers
  libfabric-dev libfabric-bin     # libfabric: node-to-node transport and RMA; fi_pingpong
  librocksdb-dev                  # tier-2 KV index
  libxxhash-dev                   # XXH3-128 checksums of tier-2 blocks (over key + data)
  fio                             # the tier-2 store's I/O baseline (`tandem bench tier2`)
  libspdlog-dev                   # logging
  doctest-dev                     # tests
  libtomlplusplus-dev             # cluster manifest
  libedit-dev                     # admin shell line editing, history, completion
  libssl-dev openssl              # SHA-256 block hashing; `openssl speed` baseline
  libopenblas-dev                 # CPU device matmuls on both cores
  nlohmann-json3-dev              # JSON: HTTP bodies, HF config.json / tokenizer.json
  libpcre2-dev                    # tokenizer pre-split regexes with Unicode classes (\p{L}, \p{N})
  nodejs npm                      # JS tokenizers + official SDKs used by tests
  curl procps iproute2            # tests talk HTTP, inspect processes and ports
  tmux                            # drives the interactive admin shell in a test
  chromium                        # headless: the status page's browser test (loads, drain, screenshot)
  # clang + compiler-rt: libFuzzer and clang's ASan/UBSan runtimes for the fuzz targets
  # (tests/fuzz, fuzzed for a bounded time by `quickstart.sh test`). libFuzzer is in
  # libclang-rt-14-dev, which clang does not pull in. (g++'s ASan/UBSan runtimes for build-asan
  # come with g++ itself: libasan8, libubsan1.)
  clang libclang-rt-14-dev
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

# Node.js may come from elsewhere (e.g. NodeSource, which bundles npm and conflicts with
# Debian's npm package): when `node` and `npm` already work, do not ask apt for them.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${packages[@]}"; do
    case "$p" in nodejs|npm) ;; *) filtered+=("$p") ;; esac
  done
  packages=("${filtered[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

# Further setup steps (npm packages, models) are appended by their owners below.
for step in "$here"/tools/setup.d/*.sh; do
  [ -e "$step" ] || continue
  bash "$step"
done
echo "setup: done"
