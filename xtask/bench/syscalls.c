/* syscalls: the cost of a trivial system call, measured by the process itself.
 *
 * Usage: syscalls N
 * Calls getppid() N times through syscall(2) and prints
 *   ns_per_syscall <float>
 * (the process's CPU time, user + system, / N). Growth mode attaches eBPF programs to syscall
 * tracepoints; while any is attached, every system call of every process takes the kernel's
 * tracing entry and exit path, and this measures what that adds to a syscall.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s N\n", argv[0]);
        return 64;
    }
    long n = atol(argv[1]);
    if (n <= 0) return 64;
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++) syscall(SYS_getppid);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    double cpu = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("ns_per_syscall %.2f\n", cpu / n);
    return 0;
}
