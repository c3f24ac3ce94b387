#!/usr/bin/env bash
# Installs what building Spillway needs on a fresh Debian machine (the CUDA toolkit is
# expected to be there already; without it the library builds with the host backend only).
# Does nothing when everything is present. liburing is optional: if it cannot be installed,
# the build warns and the disk tier uses POSIX I/O only (its io_uring tests are skipped).
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v gcc >/dev/null 2>&1 || need+=(build-essential)
command -v g++ >/dev/null 2>&1 || need+=(g++) # the C++ header's tests and example
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/liburing.h ] || need+=(liburing-dev)
[ ${#need[@]} -eq 0 ] && exit 0
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
if $sudo_cmd apt-get update -qq &&
   DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null; then
  echo "setup: installed ${need[*]}"
elif command -v cmake >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1; then
  echo "setup: could not install ${need[*]}; building without them (no io_uring)" >&2
else
  echo "setup: could not install ${need[*]}, and cmake or gcc is missing" >&2
  exit 1
fi
