#!/usr/bin/env bash
# Installs what building Spillway needs on a fresh Debian machine (the CUDA toolkit is
# expected to be there already; without it the library builds with the host backend only).
# Does nothing when everything is present.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v gcc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/liburing.h ] || need+=(liburing-dev)
if [ ${#need[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
  echo "setup: installed ${need[*]}"
fi
