#!/usr/bin/env bash
# Layering: the layers below the engine (wire/, reduce/, common/) never
# include engine/ or anything above it (dataplane/, control/, host-lib/).
set -euo pipefail
cd "${1:?usage: check_layering.sh SOURCE_ROOT}"
if hits=$(grep -rnE '#include "(engine|dataplane|control|host-lib)/' src/wire src/reduce src/common); then
  echo "check_layering: a lower layer includes a higher one:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check_layering: wire/, reduce/ and common/ include nothing above them"
