/* hold: allocates N blocks of SIZE bytes with malloc, keeps them all live, prints
 *   held <N>
 * then sleeps SECONDS and exits (without freeing). `cargo xtask bench` reads the agent's CPU
 * time, its RSS and the BPF map memory while the N allocations are live.
 *
 * Usage: hold N SIZE SECONDS
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *(*volatile malloc_fp)(size_t) = malloc;

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s N SIZE SECONDS\n", argv[0]);
        return 64;
    }
    long n = atol(argv[1]);
    size_t size = (size_t)atol(argv[2]);
    int secs = atoi(argv[3]);
    void **blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks) return 1;
    for (long i = 0; i < n; i++) {
        blocks[i] = malloc_fp(size);
        if (!blocks[i]) abort();
    }
    printf("held %ld\n", n);
    fflush(stdout);
    sleep((unsigned)secs);
    return blocks[n - 1] == NULL;
}
