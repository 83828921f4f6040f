/* deep: the cost of a malloc+free pair made 20 calls below main, for the unwinding bench.
 *
 * Usage: deep N SIZE
 * main → level_1 → … → level_20, which calls malloc(SIZE) then free() N times through volatile
 * function pointers (after a warm-up of N/10 pairs) and prints
 *   ns_per_pair <float>
 * (the process's CPU time, user + system, of the timed loop / N: the uprobes run in the
 * process's context). `cargo xtask bench` builds it twice, with and without frame pointers
 * (-O2 -fno-omit-frame-pointer / -O2 -fomit-frame-pointer): the stack walk's cost per frame is
 * what differs between the two when traced.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *(*volatile malloc_fp)(size_t) = malloc;
static void (*volatile free_fp)(void *) = free;
static long n_pairs;
static size_t size;

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

__attribute__((noinline)) static void pairs(long n) {
    for (long i = 0; i < n; i++) free_fp(malloc_fp(size));
}

__attribute__((noinline)) static int level_20(int d) {
    pairs(n_pairs / 10);
    double t0 = cpu_ns();
    pairs(n_pairs);
    double t1 = cpu_ns();
    printf("ns_per_pair %.1f\n", (t1 - t0) / n_pairs);
    __asm__ volatile("" ::: "memory");
    return d;
}

#define LEVEL(k, next)                                   \
    __attribute__((noinline)) static int level_##k(int d) { \
        int r = next(d + 1);                             \
        __asm__ volatile("" ::: "memory");               \
        return r + 1;                                    \
    }
LEVEL(19, level_20) LEVEL(18, level_19) LEVEL(17, level_18) LEVEL(16, level_17) LEVEL(15, level_16)
LEVEL(14, level_15) LEVEL(13, level_14) LEVEL(12, level_13) LEVEL(11, level_12) LEVEL(10, level_11)
LEVEL(9, level_10) LEVEL(8, level_9) LEVEL(7, level_8) LEVEL(6, level_7) LEVEL(5, level_6)
LEVEL(4, level_5) LEVEL(3, level_4) LEVEL(2, level_3) LEVEL(1, level_2)

int main(int argc, char **argv) {
    n_pairs = argc > 1 ? atol(argv[1]) : 200000;
    size = argc > 2 ? (size_t)atol(argv[2]) : 64;
    return level_1(0) > 0 ? 0 : 1;
}
