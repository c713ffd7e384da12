#!/usr/bin/env bash
# check_rooms.sh [ROOT] — every #include in core/ stays inside the rooms its room may use.
#
# Each room core/<room>/ has a meson.build whose "# Uses: a, b" line names the rooms it may
# include headers from (see core/meson.build). A header of the same room is included by
# its name ("gpt.h"), one of another room by room and name ("model/gpt.h"); public headers
# as "loom/...". Fails, naming file, line and include, on:
#   - a file directly in core/ other than meson.build (everything lives in a room);
#   - a room without a "# Uses:" line, or one naming a room that does not exist;
#   - an include of a room not on the Uses: line, of a header that does not exist, or of
#     another room's header by its bare name;
#   - kernels/ or plugins/ including a core header (they reach the core through loom_host).
# ROOT defaults to the repository this script sits in. Exit 0 clean, 1 on violations.
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
core=$root/core
bad=0
fail() { echo "check_rooms: $*"; bad=1; }

[ -d "$core" ] || { echo "check_rooms: no core/ under $root"; exit 1; }
for f in "$core"/*; do
  [ -f "$f" ] && [ "$(basename "$f")" != meson.build ] && fail "core/$(basename "$f") is not in a room (move it into core/<room>/)"
done

rooms=()
for d in "$core"/*/; do rooms+=("$(basename "$d")"); done
is_room() { local r; for r in "${rooms[@]}"; do [ "$r" = "$1" ] && return 0; done; return 1; }

for room in "${rooms[@]}"; do
  mb=$core/$room/meson.build
  uses=$(grep -m1 '^# Uses:' "$mb" 2>/dev/null | sed 's/^# Uses://; s/(.*)//; s/,/ /g' | xargs)
  uses_list=${uses// /, }
  if ! grep -q '^# Uses:' "$mb" 2>/dev/null; then
    fail "core/$room has no meson.build with a '# Uses:' line"; continue
  fi
  for u in $uses; do is_room "$u" || fail "core/$room/meson.build: Uses: names '$u', which is not a room"; done
  # one grep over the room's files (not two processes a file: the check runs nine times
  # in core_rooms)
  while IFS=: read -r f line inc; do
      rel=core/$room/${f##*/}
      case $inc in
        loom/*) [ -f "$root/include/$inc" ] || fail "$rel:$line: includes \"$inc\", which include/ does not have" ;;
        */*) r=${inc%%/*}
             if ! is_room "$r"; then fail "$rel:$line: includes \"$inc\": '$r' is not a room"
             elif [ "$r" = "$room" ]; then fail "$rel:$line: includes \"$inc\" from its own room: write \"${inc#*/}\""
             elif ! [[ " $uses " == *" $r "* ]]; then fail "$rel:$line: includes \"$inc\", but core/$room may use only: ${uses_list:-no other room}"
             elif [ ! -f "$core/$inc" ]; then fail "$rel:$line: includes \"$inc\", which does not exist"
             fi ;;
        *) if [ ! -f "$core/$room/$inc" ]; then
             owner=$(cd "$core" && ls */"$inc" 2>/dev/null | head -1)
             fail "$rel:$line: includes \"$inc\", which is not in core/$room${owner:+ (it is $owner: write \"$owner\" if core/$room may use it)}"
           fi ;;
      esac
  done < <(find "$core/$room" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \) -print0 |
           xargs -0 -r grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' |
           sed -E 's/^([^:]+):([0-9]+):.*"([^"]*)".*/\1:\2:\3/')
done

for dir in kernels plugins; do
  [ -d "$root/$dir" ] || continue
  while IFS=: read -r file line inc; do
    r=${inc%%/*}
    [ "$r" != "$inc" ] && is_room "$r" && fail "${file#$root/}:$line: includes core header \"$inc\" (kernels and plugins reach the core only through loom_host)"
  done < <(grep -rn --include='*.c' --include='*.h' --include='*.cu' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$root/$dir" | sed -E 's/^([^:]+):([0-9]+):.*"([^"]*)".*/\1:\2:\3/')
done

[ $bad -eq 0 ] && echo "check_rooms: ok (${#rooms[@]} rooms: ${rooms[*]})"
exit $bad
