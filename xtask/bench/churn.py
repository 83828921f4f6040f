"""churn: a pure-Python workload of dict and list churn for a fixed number of iterations.

Usage: python3 churn.py ITERATIONS
Each iteration builds a dict of 64 small lists and strings, keeps a bounded window of 256 such
dicts (the oldest is dropped), and joins some strings. Prints
    cpu_s <process CPU seconds of the loop>
    wall_s <wall-clock seconds of the loop>
"""
import sys
import time


def work(i):
    d = {}
    for k in range(64):
        d["k%d_%d" % (k, i)] = [i, k, str(i * k)] * 4
    return d


def main():
    n = int(sys.argv[1])
    window = []
    total = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        d = work(i)
        window.append(d)
        if len(window) > 256:
            window.pop(0)
        total += len("".join(d.keys()))
    c1, w1 = time.process_time(), time.perf_counter()
    print("cpu_s %.4f" % (c1 - c0))
    print("wall_s %.4f" % (w1 - w0))
    print("total %d" % total)


main()
