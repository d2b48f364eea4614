#!/usr/bin/env bash
# The house style (.clang-format at the root) holds over every C and C++
# source of the tree: `clang-format --dry-run --Werror` on each .h/.cc under
# src/ tests/ bench/ tools/. On failure the offending lines are printed and
# `clang-format -i FILE...` is the fix.
set -euo pipefail
root=${1:?usage: check_format.sh SOURCE_ROOT}
cd "$root"
mapfile -d '' files < <(find src tests bench tools -type f \( -name '*.cc' -o -name '*.h' -o -name '*.hpp' \) -print0 | sort -z)
if [ ${#files[@]} -eq 0 ]; then
  echo "check_format: no sources found under $root" >&2
  exit 1
fi
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "check_format: files above are not clang-formatted; run clang-format -i on them" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clang-formatted"
