#!/usr/bin/env bash
# check_rooms_test.sh — check_rooms.sh passes on this tree and fails on each kind of
# violation planted in a copy of it (so the layout check can fail).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check=$here/check_rooms.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$check" "$root" || { echo "FAIL: the tree itself breaks the room rules"; exit 1; }

fresh() { rm -rf "$tmp/t"; mkdir -p "$tmp/t"; cp -r "$root/core" "$root/include" "$tmp/t/"; mkdir -p "$tmp/t/plugins/x"; }
expect_fail() { # $1 = what, $2 = text the message must hold
  local out; out=$("$check" "$tmp/t" 2>&1) && { echo "FAIL: $1 was not refused"; exit 1; }
  grep -qF -- "$2" <<<"$out" || { echo "FAIL: $1 refused without naming '$2':"; echo "$out"; exit 1; }
  echo "ok refused: $1 ($(grep -m1 check_rooms <<<"$out"))"
}

fresh; "$check" "$tmp/t" >/dev/null || { echo "FAIL: a clean copy is refused"; exit 1; }
fresh; sed -i '0,/#include/s//#include "train\/session.h"\n#include/' "$tmp/t/core/model/gpt.c"
expect_fail "model including train" 'core/model/gpt.c:'
fresh; sed -i '0,/#include/s//#include "lua\/lua_loom.h"\n#include/' "$tmp/t/core/io/json.c"
expect_fail "io including lua" 'core/io may use only: base, model'
fresh; sed -i '0,/#include/s//#include "status.h"\n#include/' "$tmp/t/core/model/params.c"
expect_fail "another room's header by bare name" 'it is base/status.h'
fresh; sed -i '0,/#include/s//#include "base\/nothere.h"\n#include/' "$tmp/t/core/train/session.c"
expect_fail "a header that does not exist" 'does not exist'
fresh; touch "$tmp/t/core/stray.c"
expect_fail "a file outside the rooms" 'core/stray.c is not in a room'
fresh; sed -i '/^# Uses:/d' "$tmp/t/core/dist/meson.build"
expect_fail "a room without Uses:" "core/dist has no meson.build with a '# Uses:' line"
fresh; printf '#include "base/status.h"\n' > "$tmp/t/plugins/x/x.c"
expect_fail "a plugin including a core header" 'plugins/x/x.c:1: includes core header'
echo "all room checks pass and fail as they should"
