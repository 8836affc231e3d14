#!/usr/bin/env bash
# Builds Triton's own C++ PyTorch (libtorch / TorchScript) backend (triton-inference-server/pytorch_backend r24.07,
# with its common, core and backend repositories at r24.07, the tag of the nvidia-pytriton==0.5.10 server) against
# the libtorch of a pip-installed torch, into OUT: libtriton_pytorch.so, whose RUNPATH is $ORIGIN and that torch's
# torch/lib (nothing of torch is copied). bench/gpu.py --encoder torchscript serves its stand-in encoder with it
# (PYTORCH_BACKEND=OUT); docs/benchmarks-gpu.md has the recipe for the lent GPU machines.
#
#   bash bench/build_pytorch_backend.sh OUT          (e.g. OUT=.triton/pytorch-backend: ignored by git)
#
# Needs: cmake >= 3.18, g++ with C++20 (torch >= 2.10's headers want it), make, git; a Python whose torch has its
# C++ headers (torch/include) and libraries (torch/lib); RapidJSON's headers and googletest's sources (Debian:
# rapidjson-dev, googletest; or carried in SOURCES); for a GPU build the CUDA toolkit (nvcc, cuda_runtime_api.h)
# of torch's CUDA major version (found as CMake finds it: nvcc on PATH, CUDACXX, or /usr/local/cuda). No network
# when SOURCES holds the sources: a lent GPU machine has none. A CPU build (torch 2.13.0+cpu) from scratch took 1-2
# minutes on 2 busy cores (~50 s of CPU), ~11 MB of disk in WORK.
# Two changes to r24.07's sources, made here (step 3): Python's development files become optional, and a GPU
# build's CUDA architectures start at 75 (CUDA 13 has no older ones).
# Settings (environment):
#   PYTHON    the Python whose torch is built against (default: python3)
#   GPU       on | off | auto (default): auto is on when that torch has CUDA (torch.version.cuda)
#   SOURCES   a folder holding pytorch_backend/, common/, core/, backend/ git clones (any branch, shallow clones of
#             the tag are enough: r24.07 is checked out), used instead of cloning them from GitHub; and optionally
#             rapidjson/ (RapidJSON's include/) and googletest/ (googletest's sources), used instead of the system's
#   CUDA_ARCHS  a GPU build's CUDA architectures for backend's gather kernel (default 75-real;80-real;86-real;89-real;90:
#             Turing to Hopper, with PTX for newer GPUs)
#   WORK      build folder (default: OUT.build)
set -euo pipefail
OUT=${1:?usage: build_pytorch_backend.sh OUT_FOLDER}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-$OUT.build}
PYTHON=${PYTHON:-python3}
GPU=${GPU:-auto}
CUDA_ARCHS=${CUDA_ARCHS:-75-real;80-real;86-real;89-real;90}
TRITON_TAG=r24.07
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
[ -z "${SOURCES:-}" ] || SOURCES=$(cd "$SOURCES" && pwd)
say() { echo "build_pytorch_backend: $*" >&2; }

# 1. The toolchain. RapidJSON (common's JSON) and googletest (common r24.07 configures its tests unconditionally and
#    wants GTest at configure time) from SOURCES, else the system's, else apt-get (where there is a network).
for tool in cmake g++ make git; do
  command -v "$tool" >/dev/null || { say "$tool is missing"; exit 1; }
done
RAPIDJSON_ARGS=()
if [ -n "${SOURCES:-}" ] && [ -f "$SOURCES/rapidjson/include/rapidjson/rapidjson.h" ]; then
  # what rapidjson-dev's RapidJSONConfig.cmake says, for the carried headers
  mkdir -p "$WORK/rapidjson-cmake"
  echo "set(RAPIDJSON_INCLUDE_DIRS \"$SOURCES/rapidjson/include\")" >"$WORK/rapidjson-cmake/RapidJSONConfig.cmake"
  RAPIDJSON_ARGS=(-DRapidJSON_DIR="$WORK/rapidjson-cmake")
fi
GOOGLETEST=/usr/src/googletest
[ -z "${SOURCES:-}" ] || [ ! -f "$SOURCES/googletest/CMakeLists.txt" ] || GOOGLETEST="$SOURCES/googletest"
if [ ${#RAPIDJSON_ARGS[@]} = 0 ] && [ ! -f /usr/include/rapidjson/rapidjson.h ] || [ ! -f "$GOOGLETEST/CMakeLists.txt" ]; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq rapidjson-dev googletest || {
    say "no RapidJSON headers or googletest sources: install rapidjson-dev and googletest, or carry them in" \
        "SOURCES/rapidjson (its include/) and SOURCES/googletest"; exit 1; }
fi

# 2. torch: where its headers and libraries are, its C++ ABI, whether it has CUDA.
read -r TORCH_DIR TORCH_VERSION TORCH_ABI TORCH_CUDA < <("$PYTHON" -c '
import os, torch
print(os.path.dirname(torch.__file__), torch.__version__, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.version.cuda or "none")')
[ -f "$TORCH_DIR/include/torch/script.h" ] && [ -f "$TORCH_DIR/lib/libtorch.so" ] || {
  say "$TORCH_DIR has no include/torch/script.h or lib/libtorch.so: a torch wheel with its C++ files is needed"; exit 1; }
if [ "$GPU" = auto ]; then GPU=$([ "$TORCH_CUDA" = none ] && echo off || echo on); fi
case "$GPU" in
  on) ENABLE_GPU=ON
      [ "$TORCH_CUDA" != none ] || { say "GPU=on, but torch $TORCH_VERSION has no CUDA"; exit 1; } ;;
  off) ENABLE_GPU=OFF ;;
  *) say "GPU must be on, off or auto"; exit 1 ;;
esac
if [ "$ENABLE_GPU" = ON ] && [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# The RUNPATH: torch/lib, and for a GPU build the folder of the libcudart that torch's CUDA library loads (a cu1xx
# wheel's comes from the nvidia-cuda-runtime wheel): the backend links libcudart.so.<major> itself, and the loader
# looks for it with the backend's RUNPATH, where the toolkit's own lib64 may not be registered.
RPATH="$TORCH_DIR/lib"
if [ "$ENABLE_GPU" = ON ]; then
  cudart=$(ldd "$TORCH_DIR/lib/libtorch_cuda.so" 2>/dev/null | awk '/libcudart\.so/ {print $3; exit}')
  [ -z "$cudart" ] || [ ! -f "$cudart" ] || RPATH="$RPATH:$(dirname "$(readlink -f "$cudart")")"
fi

# 3. The sources, at the server's tag.
. "$(dirname "${BASH_SOURCE[0]}")/../local_triton/triton_sources.sh"
clone_triton_sources "$WORK" "$TRITON_TAG" pytorch_backend common core backend
# Two changes to r24.07 (git checkout undoes them first, so a rerun starts from the tag). pytorch_backend's
# CMakeLists requires Python's development files ("Python.h needed by torch headers"), which nothing this build
# compiles includes (libtorch.cc's dependency file names no Python.h, checked with torch 2.13) and a machine with
# only a torch wheel may lack: optional, so the build does not depend on python3-dev.
git -C "$WORK/src/pytorch_backend" checkout -q -- CMakeLists.txt
sed -i 's/^find_package(Python3 REQUIRED COMPONENTS Development)$/find_package(Python3 COMPONENTS Development)/' \
  "$WORK/src/pytorch_backend/CMakeLists.txt"
grep -q '^find_package(Python3 COMPONENTS Development)$' "$WORK/src/pytorch_backend/CMakeLists.txt" || {
  say "pytorch_backend's CMakeLists.txt has no find_package(Python3 REQUIRED COMPONENTS Development) line"; exit 1; }
# And for a GPU build, backend r24.07's CUDA kernel (the input collector's gather) is compiled for architectures
# 53-90, and CUDA 13 (torch's cu130) dropped everything below 75: "nvcc fatal: Unsupported gpu architecture
# 'compute_53'". Its list becomes CUDA_ARCHS.
git -C "$WORK/src/backend" checkout -q -- CMakeLists.txt
if [ "$ENABLE_GPU" = ON ]; then
  sed -i "s/CUDA_ARCHITECTURES \"53;60-real;62-real;70-real;72-real;75-real;80-real;86-real;89-real;90-real\"/CUDA_ARCHITECTURES \"$CUDA_ARCHS\"/" \
    "$WORK/src/backend/CMakeLists.txt"
  grep -q "CUDA_ARCHITECTURES \"$CUDA_ARCHS\"" "$WORK/src/backend/CMakeLists.txt" || {
    say "backend's CMakeLists.txt has no CUDA_ARCHITECTURES \"53;...;90-real\" line"; exit 1; }
fi

# 4. Configure and build. The options of a build outside NVIDIA's PyTorch container (the include and library paths
#    set: no docker; TRITON_PYTORCH_DOCKER_BUILD is derived from them in r24.07, passed for clarity), no
#    torchvision and no Torch-TensorRT; C++20 for torch's headers (TRITON_MIN_CXX_STANDARD, a cache variable of
#    every repository here), which makes RapidJSON's std::iterator a deprecation warning and common's -Werror an
#    error (hence -Wno-deprecated-declarations); torch's C++ ABI; nothing fetched at configure time. RPATH goes
#    into the RUNPATH beside $ORIGIN: the backend loads that torch's libraries where the wheel keeps them.
BUILD="$WORK/build-gpu-$ENABLE_GPU"
mkdir -p "$BUILD"
say "torch $TORCH_VERSION ($TORCH_DIR), GPU $ENABLE_GPU: configuring (log: $WORK/configure.log)"
cmake -S "$WORK/src/pytorch_backend" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$TORCH_ABI -Wno-deprecated-declarations -ffile-prefix-map=$WORK/src=triton" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath,$RPATH" \
  -DTRITON_MIN_CXX_STANDARD=20 \
  -DTRITON_ENABLE_GPU=$ENABLE_GPU -DTRITON_PYTORCH_DOCKER_BUILD=OFF \
  -DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF -DTRITON_PYTORCH_ENABLE_TORCHTRT=OFF \
  -DTRITON_PYTORCH_INCLUDE_PATHS="$TORCH_DIR/include;$TORCH_DIR/include/torch/csrc/api/include" \
  -DTRITON_PYTORCH_LIB_PATHS="$TORCH_DIR/lib" \
  -DTRITON_BACKEND_REPO_TAG=$TRITON_TAG -DTRITON_CORE_REPO_TAG=$TRITON_TAG -DTRITON_COMMON_REPO_TAG=$TRITON_TAG \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$WORK/src/common" -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$WORK/src/core" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$WORK/src/backend" -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST="$GOOGLETEST" \
  "${RAPIDJSON_ARGS[@]}" >"$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log" >&2; exit 1; }
say "building (log: $WORK/build.log)"
cmake --build "$BUILD" --target triton-pytorch-backend -j "$(nproc)" >"$WORK/build.log" 2>&1 || {
  grep -E "error|Error" "$WORK/build.log" | head -40 >&2; exit 1; }

# 5. OUT: the backend alone (torch's libraries stay in the wheel: RUNPATH), and what it was built from.
cp "$BUILD/libtriton_pytorch.so" "$OUT/"
printf 'pytorch_backend %s, torch %s (%s), GPU %s, CXX11 ABI %s, RUNPATH %s\n' "$TRITON_TAG" "$TORCH_VERSION" \
  "$TORCH_DIR" "$ENABLE_GPU" "$TORCH_ABI" "$RPATH" >"$OUT/BUILT_FROM"
echo "built: $OUT/libtriton_pytorch.so (torch $TORCH_VERSION, GPU $ENABLE_GPU); serve the stand-in encoder with:"
echo "  python -m bench.gpu --encoder torchscript --pytorch-backend $OUT ..."
