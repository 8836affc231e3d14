#!/usr/bin/env bash
# Builds Triton's own C++ onnxruntime backend, the one nvcr.io/nvidia/tritonserver:24.07-py3 serves `embedding`
# with (triton-inference-server/onnxruntime_backend r24.07, with its common, core and backend repositories at r24.07),
# for the CPU, against a released ONNX Runtime, into OUT: libtriton_onnxruntime.so with the ONNX Runtime library
# beside it (its RUNPATH is $ORIGIN). Then: make serve ONNXRUNTIME_BACKEND=OUT (the launcher lays out the rest).
#
#   bash local_triton/build_onnxruntime_backend.sh OUT            (make onnxruntime-backend: OUT=.triton/onnxruntime-backend)
#
# Needs: network access to GitHub (the sources, and ONNX Runtime's release archive), apt-get for the toolchain
# (cmake, g++, rapidjson, googletest's sources), ~1 GB of disk, about a minute of compile on 2 cores.
# Settings (environment):
#   ORT_VERSION   ONNX Runtime release (default 1.18.1, the container's)
#   ORT_DIR       a folder with ONNX Runtime's include/onnxruntime_c_api.h and lib/libonnxruntime.so.<version>, used
#                 instead of the release archive (a CPU build of this backend includes only that one header)
#   SOURCES       a folder holding onnxruntime_backend/, common/, core/, backend/ git clones (any branch: r24.07 is
#                 checked out), used instead of cloning them from GitHub
#   WORK          build folder (default: OUT.build)
set -euo pipefail
OUT=${1:?usage: build_onnxruntime_backend.sh OUT_FOLDER}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ORT_VERSION=${ORT_VERSION:-1.18.1}
WORK=${WORK:-$OUT.build}
TRITON_TAG=r24.07
mkdir -p "$WORK"

# 1. The toolchain. common r24.07 configures its tests unconditionally and wants GTest at configure time: Debian's
#    googletest sources (/usr/src/googletest) stand in for the archive it would download.
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
PACKAGES="cmake g++ make git rapidjson-dev googletest"
dpkg -s $PACKAGES >/dev/null 2>&1 || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $PACKAGES; }

# 2. The sources, at the container's tag.
. "$(dirname "${BASH_SOURCE[0]}")/triton_sources.sh"
clone_triton_sources "$WORK" "$TRITON_TAG" onnxruntime_backend common core backend

# 3. ONNX Runtime: its C API header and library, of one version.
ORT="$WORK/onnxruntime-$ORT_VERSION"
if [ -n "${ORT_DIR:-}" ]; then
  ORT=$(cd "$ORT_DIR" && pwd)
elif [ ! -f "$ORT/include/onnxruntime_c_api.h" ]; then
  archive="onnxruntime-linux-x64-$ORT_VERSION"
  curl -fsSL "https://github.com/microsoft/onnxruntime/releases/download/v$ORT_VERSION/$archive.tgz" -o "$WORK/$archive.tgz"
  mkdir -p "$ORT"
  tar xzf "$WORK/$archive.tgz" -C "$ORT" --strip-components=1
fi
library=$(ls "$ORT"/lib/libonnxruntime.so.1.* 2>/dev/null | head -1)
[ -n "$library" ] && [ -f "$ORT/include/onnxruntime_c_api.h" ] || {
  echo "build_onnxruntime_backend: $ORT has no include/onnxruntime_c_api.h and lib/libonnxruntime.so.1.*" >&2; exit 1; }
# The header's API version may not be above the library's (the backend asks the library for it at load).
header_api=$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/\1/p' "$ORT/include/onnxruntime_c_api.h")
library_minor=$(basename "$library" | cut -d. -f4)
[ "$header_api" -le "$library_minor" ] || {
  echo "build_onnxruntime_backend: the header's ORT_API_VERSION $header_api is above $(basename "$library")" >&2; exit 1; }
# find_library(onnxruntime) wants the unversioned name; a folder of our own, so ORT_DIR stays untouched
mkdir -p "$WORK/ort-lib"
cp -a "$ORT"/lib/libonnxruntime* "$WORK/ort-lib/"
ln -sf "$(basename "$library")" "$WORK/ort-lib/libonnxruntime.so"

# 4. Configure and build: CPU only (no CUDA, TensorRT or OpenVINO), nothing fetched at configure time.
BUILD="$WORK/build"
mkdir -p "$BUILD"
cmake -S "$WORK/src/onnxruntime_backend" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-ffile-prefix-map=$WORK/src=triton" \
  -DTRITON_ENABLE_GPU=OFF -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF \
  -DTRITON_BUILD_ONNXRUNTIME_VERSION="$ORT_VERSION" \
  -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$ORT/include" -DTRITON_ONNXRUNTIME_LIB_PATHS="$WORK/ort-lib" \
  -DTRITON_BACKEND_REPO_TAG=$TRITON_TAG -DTRITON_CORE_REPO_TAG=$TRITON_TAG -DTRITON_COMMON_REPO_TAG=$TRITON_TAG \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$WORK/src/common" -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$WORK/src/core" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$WORK/src/backend" -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
  >"$WORK/configure.log"
cmake --build "$BUILD" --target triton-onnxruntime-backend -j "$(nproc)" >"$WORK/build.log"

# 5. OUT: the backend and the ONNX Runtime library it loads from its own folder.
cp "$BUILD/libtriton_onnxruntime.so" "$OUT/"
cp -a "$ORT"/lib/libonnxruntime.so.1.* "$OUT/"
[ ! -f "$ORT/lib/libonnxruntime_providers_shared.so" ] || cp "$ORT/lib/libonnxruntime_providers_shared.so" "$OUT/"
echo "built: $OUT/libtriton_onnxruntime.so (ONNX Runtime $(basename "$library")); serve with:"
echo "  make serve ONNXRUNTIME_BACKEND=$OUT"
