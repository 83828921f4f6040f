"""A Python heap of about N objects for `cargo xtask bench --pyheap-only` (xtask/src/bench/pyheap.rs):
N/4 lists, each of an int, a str and a float (a list, an int, a str and a float: 4 objects a
row; ints from 1000 up, past the small-int cache). Prints "ready" once built, keeps running for
SECS seconds (argv[2]), then prints "sum S", S = the sum over the rows of the int plus the str's
length plus the float's integral part: the bench checks it against the value computed outside,
so a census that changed the heap would show."""
import sys
import time

rows = int(sys.argv[1]) // 4 if len(sys.argv) > 1 else 250_000
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
data = [[1000 + i, "row-%d" % i, i + 0.5] for i in range(rows)]
print("ready", len(data), flush=True)
end = time.monotonic() + secs
while time.monotonic() < end:
    time.sleep(0.05)
print("sum", sum(r[0] + len(r[1]) + int(r[2]) for r in data), flush=True)
