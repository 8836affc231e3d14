# Sourced by the scripts that build Triton's backends (local_triton/build_onnxruntime_backend.sh,
# bench/build_pytorch_backend.sh): one way to get Triton's repositories at a tag.
#
#   clone_triton_sources WORK TAG REPOSITORY...
#
# Each REPOSITORY of triton-inference-server checked out at TAG in WORK/src/REPOSITORY: cloned from
# $SOURCES/REPOSITORY (local clones, for machines without GitHub) when SOURCES is set, else from GitHub; an existing
# clone is reused (and set back to TAG).
clone_triton_sources() {
  local work=$1 tag=$2 repository target
  shift 2
  for repository in "$@"; do
    target="$work/src/$repository"
    if [ ! -d "$target/.git" ]; then
      if [ -n "${SOURCES:-}" ]; then
        git clone -q "$SOURCES/$repository" "$target"
      else
        git clone -q "https://github.com/triton-inference-server/$repository.git" "$target"
      fi
    fi
    git -C "$target" checkout -q "$tag"
  done
}
