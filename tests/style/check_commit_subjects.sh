#!/usr/bin/env bash
# Commit subjects are `area: summary`, at most 72 characters (the why goes in
# the body). Checked for every commit after BASE, the last commit made before
# the rule was checked; older history is left as it is.
#
#   check_commit_subjects.sh SOURCE_DIR
#
# A shallow clone without BASE is checked over the commits it has.
set -euo pipefail
src=$1
limit=72

cd "$src"
# A checkout owned by another user is still this test's to read.
git() { command git -c safe.directory="$PWD" "$@"; }
if ! err=$(git rev-parse --git-dir 2>&1); then
  echo "FAIL: $src: git rev-parse: $err (commit subjects cannot be checked)" >&2
  exit 1
fi
base=$(git rev-parse --verify -q "6c7a448d55ebf8f3484d81b403cc0c13f85fc95e^{commit}" || true)
if [ -n "$base" ]; then
  range=("$base..HEAD")
elif [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  range=(HEAD)
else
  echo "FAIL: commit 6c7a448 is not in this history: cannot tell which commits the rule covers" >&2
  exit 1
fi

bad=$(git log --format='%h %s' "${range[@]}" | awk -v n="$limit" 'length($0) - index($0, " ") > n')
unscoped=$(git log --no-merges --format='%h %s' "${range[@]}" |
  grep -vE '^[0-9a-f]+ [A-Za-z0-9_./+-]+([ ,]+[A-Za-z0-9_./+-]+)*: [^ ]' || true)
count=$(git rev-list --no-merges --count "${range[@]}")
status=0
if [ -n "$bad" ]; then
  echo "FAIL: commit subjects over $limit characters (the why belongs in the body):" >&2
  echo "$bad" >&2
  status=1
fi
if [ -n "$unscoped" ]; then
  echo "FAIL: commit subjects not of the form 'area: summary':" >&2
  echo "$unscoped" >&2
  status=1
fi
[ $status -ne 0 ] || echo "commit subjects: $count commits since 6c7a448, each 'area: summary' of at most $limit characters"
exit $status
