#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks that every path into src/, spill/, tests/, bench/ or scripts/ that the docs
# (README.md, docs/*.md) or a source file's text names still exists, so that a file moved
# or renamed does not leave its old name behind. Run by scripts/test.sh; alone:
# `scripts/check_paths.sh` (exit 1 and a list of file:line: path when one is missing).
#
# What is checked: a word that starts with one of those folders (not a part of a longer path
# such as bindings/python/src/...) and either names a file (its last part has a dot), ends
# with "/", or goes two folders deep. A glob (tests/test_*.c) must match something. A name
# without an extension may also be a built program: then a source of that name, or an
# add_executable() of it in the folder's CMakeLists.txt, must exist (build/tests/stress/
# spw_stress is named as tests/stress/spw_stress). CMake files are left to CMake, which
# checks its own paths.
set -euo pipefail
cd "$(dirname "$0")/.."

exists() { # exists PATH -> 0 if the path, a glob match or a built program of that name exists
  local p=${1%/} g
  [ -e "$p" ] && return 0
  if [[ $p == *'*'* ]]; then
    for g in $p; do [ -e "$g" ] && return 0; done
    return 1
  fi
  [[ ${p##*/} == *.* ]] && return 1
  for g in "$p".c "$p".cu "$p".cpp; do [ -e "$g" ] && return 0; done
  grep -qs "add_executable(${p##*/}[ )]" "$(dirname "$p")/CMakeLists.txt"
}

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- README.md 'docs/*.md' '*.c' '*.h' '*.cu' '*.cpp' '*.hpp' \
                         '*.py' '*.pyi' '*.sh' ':!:tests/fuzz/corpus')
else # an unpacked archive: every such file but build trees and carried dependencies
  mapfile -t files < <(find . \( -path './build*' -o -path ./.deps -o -path ./.git \
                         -o -path ./tests/fuzz/corpus \) -prune -o -type f \( -name README.md \
                         -o -path './docs/*.md' -o -name '*.[ch]' -o -name '*.cu' -o -name '*.cpp' \
                         -o -name '*.hpp' -o -name '*.py' -o -name '*.pyi' -o -name '*.sh' \) \
                         -print | sed 's#^\./##' | sort)
fi
bad=0
while IFS= read -r hit; do
  where=${hit%:*}
  path=${hit##*:}
  case ${path%/} in
    */*/* | */*.*) ;;                 # two folders deep, or a file
    *) [[ $path == */ ]] || continue ;; # a folder named with its slash; else prose (spill/unspill)
  esac
  if ! exists "$path"; then
    echo "$where: $path does not exist"
    bad=1
  fi
done < <(grep -noP '(?<![\w./-])(src|spill|tests|bench|scripts)/[\w.*/-]*[\w*/]' "${files[@]}" |
           sed -E 's/[.]$//')
if [ "$bad" -ne 0 ]; then
  echo "check_paths: paths above are named but do not exist (moved? renamed?)" >&2
  exit 1
fi
echo "check_paths: every named path exists (${#files[@]} files read)"
