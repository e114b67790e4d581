/* An LD_PRELOAD shim for the storage fault tests: the k-th write, pwrite, pwrite64, fsync or fdatasync on
 * one SQLite file (the database itself, its -journal or its -wal) fails with EIO.
 *
 * Disarmed, every call goes straight to libc. Armed with faultshim_arm(path, k, sticky), each call on a
 * descriptor whose /proc/self/fd link names path, path-journal or path-wal is counted; the k-th fails, and with
 * sticky set every later one fails too (a disk that has gone away, rather than one bad write). The -shm file
 * is written through mmap, not these calls, so it is never counted. Built by tests/test_storage_faults.py.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static char target[PATH_MAX];
static size_t target_len;
static long fail_at;  /* 0: disarmed */
static int sticky;
static long seen;     /* matching calls since armed */
static long failed;   /* calls failed since armed */

void faultshim_arm(const char *path, long k, int keep_failing) {
    __atomic_store_n(&fail_at, 0, __ATOMIC_SEQ_CST);
    snprintf(target, sizeof target, "%s", path);
    target_len = strlen(target);
    sticky = keep_failing;
    __atomic_store_n(&seen, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&failed, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fail_at, k, __ATOMIC_SEQ_CST);
}

void faultshim_disarm(void) { __atomic_store_n(&fail_at, 0, __ATOMIC_SEQ_CST); }
long faultshim_seen(void) { return __atomic_load_n(&seen, __ATOMIC_SEQ_CST); }
long faultshim_failed(void) { return __atomic_load_n(&failed, __ATOMIC_SEQ_CST); }

static int is_target(int fd) {
    char link[64], name[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, name, sizeof name - 1);
    if (n < 0) return 0;
    name[n] = '\0';
    if (strncmp(name, target, target_len) != 0) return 0;
    const char *rest = name + target_len;
    return *rest == '\0' || strcmp(rest, "-journal") == 0 || strcmp(rest, "-wal") == 0;
}

/* Whether this call must fail (errno is set to EIO if so). */
static int inject(int fd) {
    long k = __atomic_load_n(&fail_at, __ATOMIC_SEQ_CST);
    if (k == 0 || !is_target(fd)) return 0;
    long n = __atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST);
    if (n < k || (n > k && !sticky)) return 0;
    __atomic_add_fetch(&failed, 1, __ATOMIC_SEQ_CST);
    errno = EIO;
    return 1;
}

#define NEXT(name) static __typeof__(name) *next; if (!next) next = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    NEXT(write);
    return inject(fd) ? -1 : next(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    NEXT(pwrite);
    return inject(fd) ? -1 : next(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    NEXT(pwrite64);
    return inject(fd) ? -1 : next(fd, buf, count, offset);
}

int fsync(int fd) {
    NEXT(fsync);
    return inject(fd) ? -1 : next(fd);
}

int fdatasync(int fd) {
    NEXT(fdatasync);
    return inject(fd) ? -1 : next(fd);
}
