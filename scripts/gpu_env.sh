# SPDX-License-Identifier: Apache-2.0
# Sourced, never run, from the repository root by every GPU-machine script
# (scripts/gpu_run.sh, tests/python/run_gpu.sh, bench/peers/run_peers.sh):
#
#   . scripts/gpu_env.sh
#
# It sets up the one log directory and the carried build dependencies, the same way for all:
#
#   SPW_GPU_LOGS  where every log goes (default /tmp/gpu-logs, kept across the commands of one
#                 machine); the Python phases write to $SPW_GPU_LOGS/python, the peers to
#                 $SPW_GPU_LOGS/peers, unless OUT says otherwise.
#   .deps/pkgconf  the Debian packages pkgconf, pkgconf-bin and libpkgconf3 unpacked
#                 (dpkg -x), put on PATH when the machine has no pkg-config.
#   .deps/liburing the Debian packages liburing-dev and liburing2 unpacked, used when the
#                 machine has no liburing.h (SPW_CARRIED_URING=1 uses it anyway, to test it).
#                 A Debian .pc names /usr (prefix, libdir, includedir), so that pkg-config
#                 would hand CMake the system's include directory, which lacks liburing.h:
#                 the carried copy's .pc files are rewritten once to be relative to where
#                 they lie (prefix=${pcfiledir}/../../.., the .pc being in
#                 usr/lib/<arch>/pkgconfig), and PKG_CONFIG_PATH and CMAKE_PREFIX_PATH point
#                 at the copy. CMake then finds both the static library and the header.
#
# Also: CUDA's bin on PATH, SPILLWAY_SPILL_DIR (default /tmp). One line says what was used.
# To make .deps on a machine with network (Debian bookworm, amd64):
#   apt-get download liburing-dev liburing2 pkgconf pkgconf-bin libpkgconf3
#   for p in liburing-dev liburing2; do dpkg -x $p_*.deb .deps/liburing; done
#   for p in pkgconf pkgconf-bin libpkgconf3; do dpkg -x $p_*.deb .deps/pkgconf; done

export SPW_GPU_LOGS=${SPW_GPU_LOGS:-/tmp/gpu-logs}
mkdir -p "$SPW_GPU_LOGS"
export PATH=/usr/local/cuda/bin:$PATH
export SPILLWAY_SPILL_DIR=${SPILLWAY_SPILL_DIR:-/tmp}

spw_env_used=()
if [ -d "$PWD/.deps/pkgconf/usr/bin" ] && ! command -v pkg-config >/dev/null; then
  export PATH=$PWD/.deps/pkgconf/usr/bin:$PATH
  export LD_LIBRARY_PATH=$PWD/.deps/pkgconf/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  spw_env_used+=("pkg-config from .deps/pkgconf")
fi

# Rewrites the .pc files under $1 (a carried usr/ tree) to name their own location instead of
# /usr. Idempotent: a rewritten file no longer starts with prefix=/usr.
spw_relocate_pc() {
  local pc dir rel up
  while IFS= read -r pc; do
    grep -q '^prefix=/usr$' "$pc" || continue
    dir=$(dirname "$pc")
    rel=${dir#"$1"/}            # lib/x86_64-linux-gnu/pkgconfig, or lib/pkgconfig
    up=$(echo "$rel" | sed -E 's#[^/]+#..#g')
    sed -i -E -e "s#^prefix=/usr\$#prefix=\${pcfiledir}/$up#" \
      -e 's#^([a-z_]+)=/usr(/|$)#\1=${prefix}\2#' "$pc"
  done < <(find "$1" -name '*.pc')
}

if [ -d "$PWD/.deps/liburing/usr" ] &&
  { [ ! -f /usr/include/liburing.h ] || [ "${SPW_CARRIED_URING:-0}" = 1 ]; }; then
  spw_uring=$PWD/.deps/liburing/usr
  spw_relocate_pc "$spw_uring"
  export PKG_CONFIG_PATH=$spw_uring/lib/x86_64-linux-gnu/pkgconfig:$spw_uring/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=$spw_uring${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  spw_env_used+=("liburing from .deps/liburing")
  unset spw_uring
fi
[ ${#spw_env_used[@]} -gt 0 ] && echo "gpu_env: ${spw_env_used[*]}" >&2
unset spw_env_used
