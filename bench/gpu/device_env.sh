# Sourced by device_check.sh and device_train.sh on a GPU machine without Debian's packages:
# unpacks the folder bench/gpu/pack_for_device.sh made (argument 1, default .devcarry) into
# $UNPACKED (default /tmp/downpour-carry), sets LD_LIBRARY_PATH (CUDA libraries from the machine),
# puts Fashion-MNIST where the build machine had it, and defines run NAME SECONDS CMD... (a log
# per step under $OUT, a line per step in $out/summary.txt). Sets root, carry, out, bin.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
carry=${1:-$root/.devcarry}
carry=$(cd "$carry" && pwd)
out=${OUT:-$root/bench/gpu/out}
mkdir -p "$out"
cd "$root"
# Libraries: ours from the carry folder; CUDA's from the machine. PyTorch runs without this path:
# it brings its own cuDNN and refuses an older one found first (the H200 image's system cuDNN is 9.14).
unpacked=${UNPACKED:-/tmp/downpour-carry}
mkdir -p "$unpacked/lib" "$unpacked/bin"
tar -xJf "$carry/libs.tar.xz" -C "$unpacked/lib" && tar -xJf "$carry/bins.tar.xz" -C "$unpacked/bin" || exit 1
bin=$unpacked/bin
libdirs="$unpacked/lib"
for name in libcudnn.so.9 libcublas.so.13 libcublasLt.so.13 libcudart.so.13; do
  d=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$name" -print -quit 2>/dev/null | xargs -r dirname)
  [[ -n "$d" ]] && libdirs="$libdirs:$d" || echo "device_check: $name not found" | tee -a "$out/env.txt"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The test binaries read configs at the build machine's source path and the data at Debian's path.
src=$(cat "$carry/source_dir")
[[ -e "$src" ]] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
mkdir -p /usr/share/datasets/fashion-mnist && cp -n "$carry"/fashion-mnist/*.gz /usr/share/datasets/fashion-mnist/
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$bin"/* | grep -E "^/|=>" | sort -u | grep -E 'cud|cublas|dnnl|not found' | sort -u
  env -u LD_LIBRARY_PATH python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.backends.cudnn.version())'
} 2>&1 | tee -a "$out/env.txt"
run() {  # run NAME SECONDS CMD...: one log per step, a PASS/FAIL line in the summary
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" >"$out/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$out/summary.txt"
  tail -n 3 "$out/$name.log"
}
