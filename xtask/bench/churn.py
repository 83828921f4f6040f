"""churn: a pure-Python workload of dict and list churn for a fixed number of iterations.

Usage: python3 churn.py ITERATIONS [malloc]
Each iteration builds a dict of 64 small lists and strings, keeps a bounded window of 256 such
dicts (the oldest is dropped), and joins some strings. Pymalloc's arenas serve those objects, so
few calls reach malloc. With `malloc`, each dict also holds 64 bytes objects of 1000 bytes (over
pymalloc's 512-byte limit: each is a malloc, and a free when its dict is dropped): ~64 malloc and
~64 free calls per iteration from Python code, besides the ~1,700 PyObject_Malloc/PyObject_Free
calls that only --pymalloc traces. Prints
    cpu_s <process CPU seconds of the loop>
    wall_s <wall-clock seconds of the loop>
"""
import sys
import time


def work(i, big):
    d = {}
    for k in range(64):
        d["k%d_%d" % (k, i)] = [i, k, str(i * k)] * 4
        if big:
            d[k] = bytes(1000)
    return d


def main():
    n = int(sys.argv[1])
    big = sys.argv[2:] == ["malloc"]
    window = []
    total = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        d = work(i, big)
        window.append(d)
        if len(window) > 256:
            window.pop(0)
        total += len("".join(k for k in d.keys() if isinstance(k, str)))
    c1, w1 = time.process_time(), time.perf_counter()
    print("cpu_s %.4f" % (c1 - c0))
    print("wall_s %.4f" % (w1 - w0))
    print("total %d" % total)


main()
