/* leaktrace's bundled demo workload: a tiny message processor with one real leak and two decoys.
 *
 *   remember_message()  LEAK: 256 bytes per message, never freed (the pointer is dropped).
 *   cache_store()       bounded cache: 128 slots of 1024 bytes, a new entry every 8th message;
 *                       fills in the first ~5 s at 200 messages/s, then each insert frees the
 *                       evicted entry: rises, then flat. Not a leak.
 *   render_reply()      temporary 8192-byte buffer, freed before returning. Not a leak.
 *
 * Usage: leaktrace-demo [RATE_PER_S=200] [SECONDS=15]. Prints a status line every second and a
 * final line with the number of messages handled. Built with frame pointers and debug info. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEAK_BYTES 256
#define CACHE_SLOTS 128
#define CACHE_ENTRY_BYTES 1024
#define REPLY_BYTES 8192

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }
static volatile unsigned long sink;
static char *cache[CACHE_SLOTS];
static unsigned long cache_next;

__attribute__((noinline)) static void remember_message(unsigned long id, const char *body) {
    char *copy = malloc(LEAK_BYTES); /* the leak: nobody keeps this pointer */
    snprintf(copy, LEAK_BYTES, "%lu:%s", id, body);
    sink += (unsigned char)copy[0];
}

__attribute__((noinline)) static void cache_store(unsigned long id) {
    unsigned long slot = cache_next++ % CACHE_SLOTS;
    free(cache[slot]); /* evict the oldest entry */
    cache[slot] = malloc(CACHE_ENTRY_BYTES);
    memset(cache[slot], (int)(id & 0xff), CACHE_ENTRY_BYTES);
}

__attribute__((noinline)) static void render_reply(unsigned long id) {
    char *buf = malloc(REPLY_BYTES);
    int n = snprintf(buf, REPLY_BYTES, "reply to message %lu", id);
    memset(buf + n, ' ', REPLY_BYTES - n - 1);
    buf[REPLY_BYTES - 1] = 0;
    sink += (unsigned char)buf[REPLY_BYTES / 2];
    free(buf);
}

__attribute__((noinline)) static void handle_message(unsigned long id) {
    char body[64];
    snprintf(body, sizeof body, "order-%lu status=ok", id);
    remember_message(id, body);
    if (id % 8 == 0) cache_store(id);
    render_reply(id);
}

int main(int argc, char **argv) {
    long rate = argc > 1 ? atol(argv[1]) : 200;
    long seconds = argc > 2 ? atol(argv[2]) : 15;
    if (rate <= 0) rate = 200;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    unsigned long total = (unsigned long)(rate * seconds), id;
    for (id = 0; id < total && !stop; id++) {
        handle_message(id);
        if (id % (unsigned long)rate == 0) {
            printf("demo: t=%lus messages=%lu\n", id / rate, id);
            fflush(stdout);
        }
        next.tv_nsec += 1000000000L / rate;
        while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    printf("demo: done, %lu messages, leaked %lu bytes in remember_message\n", id, id * LEAK_BYTES);
    return 0;
}
