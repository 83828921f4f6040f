// attach_target: a process for the attach/detach part of `cargo xtask bench`
// (xtask/src/bench/attach.rs).
//
// Usage: attach_target [LIBRARY...]
// Linked against libstdc++ and libc (both probed by leaktrace). Each LIBRARY (e.g.
// libjemalloc.so.2) is dlopen'ed with RTLD_LOCAL: it serves no call of this program, but it is
// mapped, so leaktrace probes its allocator functions too (more probes per process).
// Prints "PID <pid>" once the libraries are loaded, then allocates and frees (operator new and
// delete, malloc and free) about ATTACH_TARGET_RATE times a second (default 1000) until killed.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <dlfcn.h>
#include <unistd.h>

void *volatile sink;

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!dlopen(argv[i], RTLD_NOW | RTLD_LOCAL)) {
            std::fprintf(stderr, "attach_target: %s\n", dlerror());
            return 1;
        }
    }
    std::printf("PID %d\n", (int)getpid());
    std::fflush(stdout);
    const char *rate_env = std::getenv("ATTACH_TARGET_RATE");
    long rate = rate_env ? std::atol(rate_env) : 1000;
    if (rate < 1 || rate > 1000000) rate = 1000;
    const struct timespec ms = {0, 1000000000L / rate};
    for (;;) {
        char *p = new char[100];
        sink = p;
        delete[] p;
        void *q = std::malloc(200);
        sink = q;
        std::free(q);
        nanosleep(&ms, nullptr);
    }
}
