#!/bin/bash
# Scale of discovery and symbolization (issue #13): a process mapping 300 small shared objects
# and one with ~100 MB of DWARF (-g3, 110 C++ translation units of std containers, regex and
# streams), traced by `leaktrace record --pid` for 5 s. Prints the objects' figures, then
# leaktrace's wall time, peak RSS and what the report names.
#
#   sudo xtask/bench/objects.sh [WORKDIR] [LEAKTRACE]   (defaults: target/bench/objects, target/release/leaktrace)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-$ROOT/target/bench/objects}
LT=${2:-$ROOT/target/release/leaktrace}
mkdir -p "$W/small" "$W/big"
cd "$W"

# 300 small libraries, each mallocing through its own function (-O2 -g, no frame pointers).
for i in $(seq 0 299); do
  f=small/lib$i.so
  [ -e "$f" ] && continue
  printf '#include <stdlib.h>\nvoid *small_alloc_%d(unsigned long n) { void *p = malloc(n); return p; }\n' "$i" > small/s$i.c
  gcc -O2 -g -fPIC -shared -o "$f" small/s$i.c
done

# One library with ~100 MB of DWARF: 110 translation units of the same C++ code in namespaces
# ns0..ns109, -O0 -g3 -fno-eliminate-unused-debug-types (macro and type information kept).
if [ ! -e big/libbigdebug.so ]; then
  for i in $(seq 0 109); do
    echo "g++ -O0 -g3 -fno-eliminate-unused-debug-types -fPIC -c -DNS=ns$i $ROOT/xtask/bench/bigdebug_tu.cpp -o big/tu$i.o"
  done | xargs -P "$(nproc)" -I{} sh -c '{}'
  g++ -shared -o big/libbigdebug.so big/tu*.o
fi

# The host: dlopens every library, then leaks 64 bytes through ns7_alloc every millisecond.
cat > host.c <<'HOST'
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    void *(*leak)(unsigned long) = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        void *f = dlsym(h, "ns7_alloc");
        if (f) leak = (void *(*)(unsigned long))f;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) { leak(64); usleep(1000); }
}
HOST
gcc -O2 -g -o host host.c -ldl

echo "objects: $(ls small/*.so | wc -l) small, libbigdebug.so $(du -m big/libbigdebug.so | cut -f1) MB, of which DWARF $(size -A big/libbigdebug.so | awk '/^\.debug/ {s+=$2} END {printf "%.0f", s/1048576}') MiB"
./host "$W"/small/*.so "$W/big/libbigdebug.so" > host.out &
HOST_PID=$!
trap 'kill $HOST_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do grep -q ready host.out && break; sleep 0.1; done
rm -rf rec
/usr/bin/time -f 'leaktrace: %e s wall, %U s user, %S s system, peak RSS %M KiB' \
  "$LT" record --pid "$HOST_PID" --duration 5s --quiet --out rec
python3 - rec/report.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
v = r.get("verdict", {})
print("verdict:", v.get("summary", v) if isinstance(v, dict) else v)
PY
