#!/usr/bin/env bash
# Packs what a GPU machine without Debian's packages needs to run downpour's GPU tests and
# benchmarks: the built binaries, the non-system shared libraries they link (oneDNN xz-compressed),
# and Fashion-MNIST. The GPU machine supplies the driver, CUDA runtime, cuBLAS and cuDNN.
#   bench/gpu/pack_for_device.sh [build-dir] [out-dir]   (defaults: build, .devcarry)
# Then bench/gpu/device_check.sh (tests, benchmarks) or bench/gpu/device_train.sh (a distributed
# run with GPU workers; pack with EXTRA_BINS="server/downpour-launch server/downpour-server
# server/downpour-coordinator client/worker/downpour-worker data/downpour-data") runs there, with
# out-dir carried along.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${2:-$root/.devcarry}
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib" "$out/fashion-mnist"
bins=(tests/client/gpu_agreement_test tests/client/gpu_gradcheck_test tests/client/gpu_training_test
      bench/gpu/downpour-bench-gpu client/engine/downpour-time ${EXTRA_BINS:-})
for b in "${bins[@]}"; do
  [[ -x "$build/$b" ]] || { echo "pack: $build/$b is not built" >&2; exit 1; }
  cp "$build/$b" "$out/bin/"; strip "$out/bin/$(basename "$b")"
done
# Every shared library outside glibc and CUDA (the GPU machine brings those).
for b in "$out"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda[^/]*|libcudart[^/]*|libcublas[^/]*|libcudnn[^/]*|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
# Compressed, to stay inside the device tool's 64 MiB (oneDNN alone is 40 MB).
tar -cJf "$out/libs.tar.xz" -C "$out/lib" . && tar -cJf "$out/bins.tar.xz" -C "$out/bin" . && rm -rf "$out/lib" "$out/bin"
cp /usr/share/datasets/fashion-mnist/*.gz "$out/fashion-mnist/"
echo "$root" >"$out/source_dir"   # the tests read configs under the source path compiled in
du -sh "$out"
