/* pairs: the cost of one malloc+free pair, measured by the process itself.
 *
 * Usage: pairs N SIZE [LINGER_MS]
 * Calls malloc(SIZE) then free() N times through volatile function pointers (so the compiler can
 * neither elide nor inline them), after a warm-up of N/10 pairs, and prints
 *   ns_per_pair <float>
 * (the process's CPU time, user + system, of the timed loop / N: the uprobes run in the
 * process's context, so this counts them and not the time other processes take the CPU) and
 *   wall_ns_per_pair <float>
 * (wall-clock time / N), then sleeps LINGER_MS (default 0) before exiting. Built by `cargo xtask bench` with gcc -O2 -fno-omit-frame-pointer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *(*volatile malloc_fp)(size_t) = malloc;
static void (*volatile free_fp)(void *) = free;

__attribute__((noinline)) static void loop(long n, size_t size) {
    for (long i = 0; i < n; i++) {
        void *p = malloc_fp(size);
        if (!p) abort();
        free_fp(p);
    }
}

/* Built with -DPAIRS_N=... -DPAIRS_SIZE=... -DSTART_DELAY_MS=..., it runs without arguments
 * (for tools that launch a command without arguments, like libbpf-tools memleak -c), after
 * waiting START_DELAY_MS for the tool's probes. */
#ifndef START_DELAY_MS
#define START_DELAY_MS 0
#endif

int main(int argc, char **argv) {
    long n;
    size_t size;
#ifdef PAIRS_N
    if (argc == 1) {
        struct timespec ts = {START_DELAY_MS / 1000, (START_DELAY_MS % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        n = PAIRS_N;
        size = PAIRS_SIZE;
    } else
#endif
    if (argc == 3 || argc == 4) {
        n = atol(argv[1]);
        size = (size_t)atol(argv[2]);
    } else {
        fprintf(stderr, "usage: %s N SIZE [LINGER_MS]\n", argv[0]);
        return 64;
    }
    if (n <= 0) return 64;
    loop(n / 10 + 1, size);
    struct timespec ca, cb, wa, wb;
    clock_gettime(CLOCK_MONOTONIC, &wa);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    loop(n, size);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
    clock_gettime(CLOCK_MONOTONIC, &wb);
    double cpu = (cb.tv_sec - ca.tv_sec) * 1e9 + (cb.tv_nsec - ca.tv_nsec);
    double wall = (wb.tv_sec - wa.tv_sec) * 1e9 + (wb.tv_nsec - wa.tv_nsec);
    printf("ns_per_pair %.2f\nwall_ns_per_pair %.2f\n", cpu / n, wall / n);
    fflush(stdout);
    long linger = argc == 4 ? atol(argv[3]) : 0;
    if (linger > 0) {
        struct timespec ts = {linger / 1000, (linger % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}
