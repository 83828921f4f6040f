/* floor: the cost of the probes alone. Attaches an empty eBPF program ("return 0", two
 * instructions, no helper, no map) as uprobes and uretprobes on one file at the given offsets,
 * for one launched command only (perf events with its PID), then runs the command.
 *
 * Usage: floor FILE [e:OFFSET | r:OFFSET]... -- CMD ARGS...
 *   e:OFFSET  entry uprobe at this file offset (hex with 0x, or decimal)
 *   r:OFFSET  return uprobe (uretprobe) of the function at this file offset
 * The command is forked first and held on a pipe until every probe is attached (the perf events
 * follow it through execve), like `leaktrace record -- CMD`. Exit status: the command's.
 *
 * This is what `cargo xtask bench` uses where bpftrace cannot place a uprobe at an offset inside
 * a function (Debian's bpftrace is built without the disassembler that checks the offset).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int read_int(const char *path) {
    FILE *f = fopen(path, "r");
    int v = -1;
    if (!f || fscanf(f, "%d", &v) != 1) {
        fprintf(stderr, "floor: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    return v;
}

/* Bit of `config` that makes a uprobe a return probe ("config:N" in the PMU's format). */
static int retprobe_bit(void) {
    FILE *f = fopen("/sys/bus/event_source/devices/uprobe/format/retprobe", "r");
    int bit = 0;
    if (!f || fscanf(f, "config:%d", &bit) != 1) {
        fprintf(stderr, "floor: cannot read the uprobe PMU's retprobe bit\n");
        exit(2);
    }
    fclose(f);
    return bit;
}

static int load_empty_prog(void) {
    struct bpf_insn insns[2];
    memset(insns, 0, sizeof insns);
    insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K; /* r0 = 0 */
    insns[0].dst_reg = BPF_REG_0;
    insns[1].code = BPF_JMP | BPF_EXIT;
    union bpf_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.prog_type = BPF_PROG_TYPE_KPROBE;
    attr.insns = (uint64_t)(uintptr_t)insns;
    attr.insn_cnt = 2;
    attr.license = (uint64_t)(uintptr_t)"GPL";
    strncpy(attr.prog_name, "floor_empty", sizeof attr.prog_name - 1);
    int fd = syscall(SYS_bpf, BPF_PROG_LOAD, &attr, sizeof attr);
    if (fd < 0) {
        fprintf(stderr, "floor: BPF_PROG_LOAD: %s\n", strerror(errno));
        exit(2);
    }
    return fd;
}

int main(int argc, char **argv) {
    int sep = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) { sep = i; break; }
    if (argc < 4 || sep < 3 || sep == argc - 1) {
        fprintf(stderr, "usage: %s FILE [e:OFFSET|r:OFFSET]... -- CMD ARGS...\n", argv[0]);
        return 64;
    }
    const char *file = argv[1];
    int type = read_int("/sys/bus/event_source/devices/uprobe/type");
    int rbit = retprobe_bit();
    int prog = load_empty_prog();

    int go[2];
    if (pipe(go) < 0) return 2;
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
        close(go[1]);
        char c;
        if (read(go[0], &c, 1) != 1) _exit(70); /* the parent failed to attach */
        close(go[0]);
        execvp(argv[sep + 1], argv + sep + 1);
        fprintf(stderr, "floor: cannot run %s: %s\n", argv[sep + 1], strerror(errno));
        _exit(127);
    }
    close(go[0]);
    for (int i = 2; i < sep; i++) {
        const char *spec = argv[i];
        if ((spec[0] != 'e' && spec[0] != 'r') || spec[1] != ':') {
            fprintf(stderr, "floor: bad probe %s (e:OFFSET or r:OFFSET)\n", spec);
            return 64;
        }
        struct perf_event_attr pa;
        memset(&pa, 0, sizeof pa);
        pa.size = sizeof pa;
        pa.type = type;
        pa.config = spec[0] == 'r' ? (1ULL << rbit) : 0;
        pa.config1 = (uint64_t)(uintptr_t)file; /* uprobe_path */
        pa.config2 = strtoull(spec + 2, NULL, 0); /* probe_offset */
        int fd = syscall(SYS_perf_event_open, &pa, child, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd < 0 || ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog) < 0 || ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {
            fprintf(stderr, "floor: cannot attach %s to %s: %s\n", spec, file, strerror(errno));
            kill(child, SIGKILL);
            return 2;
        }
    }
    fprintf(stderr, "floor: attached %d probes\n", sep - 2);
    if (write(go[1], "g", 1) != 1) return 2;
    close(go[1]);
    int status;
    if (waitpid(child, &status, 0) < 0) return 2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
