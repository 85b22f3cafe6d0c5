/*
 * clockshift: moves a process's wall clock, for tests that step Redis's
 * clock (libfaketime cannot: it recurses with jemalloc, which redis-server
 * uses; wolfcw/libfaketime#130). Preloaded with LD_PRELOAD; the offset in
 * ms, a signed decimal, is read from the file CLOCKSHIFT_FILE names on
 * every call, so a test steps the clock by rewriting that file. Only the
 * wall clock moves (CLOCK_REALTIME and its coarse variant, gettimeofday,
 * time); monotonic clocks do not, as when NTP steps a host's clock. Real
 * times come from the system calls themselves, so nothing here calls back
 * into the clock functions it replaces.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ms(void) {
    static int fd = -2;
    if (fd == -2) {
        const char *path = getenv("CLOCKSHIFT_FILE");
        fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    }
    if (fd < 0) return 0;
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strtoll(buf, NULL, 10);
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_nsec + (offset_ms() % 1000) * 1000000LL;
    ts->tv_sec += offset_ms() / 1000 + ns / 1000000000LL;
    ns %= 1000000000LL;
    if (ns < 0) { ns += 1000000000LL; ts->tv_sec -= 1; }
    ts->tv_nsec = ns;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
