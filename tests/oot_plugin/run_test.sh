#!/bin/sh
# run_test.sh BUILD_DIR [CHECKER] — the out-of-tree plugin story, end to end:
#   1. install BUILD_DIR into a temporary root (meson install --destdir);
#   2. build lion.c from a copy of this folder with nothing but its Makefile and
#      `pkg-config --cflags loom`, pkg-config pointed at the temporary root only;
#   3. put the .so on LOOM_PLUGIN_PATH and check that loom accepts it, exports one symbol,
#      and computes Lion's update (CHECKER = loom-oot-check), and that `loom plugins` lists
#      it when the CLI is built.
# Exit 0 pass, 1 fail, 77 skip (only when pkg-config or a C compiler is missing).
set -eu

BUILD=${1:?usage: run_test.sh BUILD_DIR [CHECKER]}
CHECKER=${2:-$BUILD/tests/plugins/loom-oot-check}
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$BUILD" && pwd)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
. "$HERE/../e2e/lib.sh"   # the number checks (max_field_diff, below, loss_fell)

PKG_CONFIG=${PKG_CONFIG:-pkg-config}
CC=${CC:-cc}
command -v "$PKG_CONFIG" >/dev/null 2>&1 ||
    skip "'$PKG_CONFIG' not found; out-of-tree plugins are built with pkg-config --cflags loom (apt-get install pkgconf)"
command -v "$CC" >/dev/null 2>&1 || skip "no C compiler '$CC' found; set CC or install one"
command -v meson >/dev/null 2>&1 || fail "meson not on PATH; it is needed to install $BUILD"
[ -x "$CHECKER" ] || fail "checker '$CHECKER' not built"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-oot.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
ROOT=$TMP/root

# 1. Install. --no-rebuild: meson test has built everything, and a nested ninja would race.
meson install -C "$BUILD" --destdir "$ROOT" --no-rebuild --quiet >"$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log" >&2; fail "meson install --destdir $ROOT failed"; }
PC=$(find "$ROOT" -name loom.pc | head -n 1)
[ -n "$PC" ] || fail "no loom.pc installed under $ROOT"

# Only the temporary root: PKG_CONFIG_LIBDIR hides a system-wide loom.pc, and the sysroot
# maps the .pc file's prefix (/usr/local, say) into the destdir.
PKG_CONFIG_PATH=$(dirname "$PC")
PKG_CONFIG_LIBDIR=$PKG_CONFIG_PATH
PKG_CONFIG_SYSROOT_DIR=$ROOT
export PKG_CONFIG_PATH PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
CFLAGS_LOOM=$("$PKG_CONFIG" --cflags loom) || fail "pkg-config --cflags loom failed"
case "$CFLAGS_LOOM" in
    *"-I$ROOT/"*) ;;
    *) fail "pkg-config --cflags loom gave '$CFLAGS_LOOM', expected -I$ROOT/..." ;;
esac
INC=$(printf '%s\n' "$CFLAGS_LOOM" | sed 's/.*-I\([^ ]*\).*/\1/')
[ -f "$INC/loom/plugin/optim.h" ] || fail "installed headers missing: no $INC/loom/plugin/optim.h"
echo "pkg-config --cflags loom: $CFLAGS_LOOM"

# 2. Build from a copy, so the source folder stays clean and nothing of the tree leaks in.
SRC=$TMP/src
mkdir -p "$SRC"
cp "$HERE/lion.c" "$HERE/Makefile" "$SRC/"
if command -v make >/dev/null 2>&1; then
    make -C "$SRC" CC="$CC" PKG_CONFIG="$PKG_CONFIG" >"$TMP/build.log" 2>&1 ||
        { cat "$TMP/build.log" >&2; fail "building lion.c failed"; }
else # the same command the Makefile runs
    (cd "$SRC" && $CC -shared -fPIC -fvisibility=hidden -O2 $CFLAGS_LOOM lion.c \
        -o loom-optim-lion.so) || fail "building lion.c failed"
fi
cat "$TMP/build.log" 2>/dev/null || true
PLUGINS=$TMP/plugins
mkdir -p "$PLUGINS"
cp "$SRC/loom-optim-lion.so" "$PLUGINS/"

if command -v nm >/dev/null 2>&1; then
    EXPORTS=$(nm -D --defined-only "$PLUGINS/loom-optim-lion.so" | awk '$2 ~ /^[TDBR]$/ {print $3}')
    [ "$EXPORTS" = "loom_plugin_entry" ] ||
        fail "loom-optim-lion.so should export only loom_plugin_entry, exports: $(echo $EXPORTS)"
fi

# 3. Load it from LOOM_PLUGIN_PATH, and check three Lion steps (lr 0.1, betas {0.9, 0.99},
# weight_decay 0.5) against values worked out by hand from the paper's update.
LOOM_PLUGIN_PATH=$PLUGINS
export LOOM_PLUGIN_PATH
"$CHECKER" optim lion lr=0.1 weight_decay=0.5 >"$TMP/check.out" 2>&1 ||
    { cat "$TMP/check.out" >&2; fail "loom refused or failed to run the plugin"; }
cat "$TMP/check.out"
grep -q "^plugin optim lion 0.1.0 $PLUGINS/loom-optim-lion.so\$" "$TMP/check.out" ||
    fail "lion was not loaded from LOOM_PLUGIN_PATH"
grep -q '^state_per_param 1$' "$TMP/check.out" || fail "lion should keep 1 state slot"
cat >"$TMP/expected" <<'END'
step 1 0.85 -0.85 0.475 -0.1
step 2 0.9075 -0.7075 0.35125 0.005
step 3 0.962125 -0.772125 0.2336875 -0.09525
END
# "step t p0..p3" from the checker and expected: the same steps, finite, within 1e-6
d=$(max_field_diff '^step ' "3 4 5 6" "$TMP/check.out" "$TMP/expected") && below "$d" 1e-6 ||
    { cat "$TMP/expected" >&2; fail "Lion's update differs from the reference (max |diff| '$d')"; }

if [ -x "$BUILD/loom" ]; then
    "$BUILD/loom" plugins >"$TMP/plugins.out" 2>&1 ||
        { cat "$TMP/plugins.out" >&2; fail "'loom plugins' failed"; }
    grep -q "lion" "$TMP/plugins.out" || { cat "$TMP/plugins.out" >&2; fail "'loom plugins' does not list lion"; }
    echo "loom plugins lists lion"
    # 4. A recipe trains with it: one word in the optimizer table, nothing rebuilt.
    recipe="$(cd "$(dirname "$0")/.." && pwd)/e2e/recipes/losses.lua"
    "$BUILD/loom" run "$recipe" 'optimizer={"lion", lr=2e-3, weight_decay=0.1}' >"$TMP/train.out" 2>&1 ||
        { cat "$TMP/train.out" >&2; fail "training with lion failed"; }
    grep -q '| lion |' "$TMP/train.out" || { cat "$TMP/train.out" >&2; fail "the run did not use lion"; }
    fell=$(loss_fell "$TMP/train.out" 0.5) || fail "loss with lion did not fall: $fell"
    echo "a recipe trained with lion: loss $fell"
fi
echo "PASS: out-of-tree plugin built with pkg-config only and accepted from LOOM_PLUGIN_PATH"
