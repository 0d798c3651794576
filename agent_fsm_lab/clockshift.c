/* Steps the wall clock of one process tree, as an NTP step does, and nothing else.
 *
 * Preloaded into the agent unit by the e2e judgment tests (LD_PRELOAD, a drop-in): the wall
 * clock (CLOCK_REALTIME and its coarse variant, gettimeofday, time) reads the real time plus the
 * whole seconds written in $AGENT_FSM_LAB_CLOCK_SHIFT (a file holding e.g. "+3600" or "-3600";
 * read at every call, so a test moves the clock while the unit runs). The monotonic clock and
 * every sleep stay real, as they do across a real step. (libfaketime with its monotonic clock
 * left real makes clock_nanosleep fail with EINVAL, so Python's time.sleep and a subprocess's
 * wait with a timeout failed under it.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

#pragma GCC diagnostic ignored "-Wnonnull-compare" /* glibc says nonnull; callers pass NULL */

static long long shift_seconds(void) {
    const char *path = getenv("AGENT_FSM_LAB_CLOCK_SHIFT");
    long long seconds = 0;
    FILE *f;
    if (path == NULL || (f = fopen(path, "re")) == NULL)
        return 0;
    if (fscanf(f, "%lld", &seconds) != 1)
        seconds = 0;
    fclose(f);
    return seconds;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    int rc;
    if (real == NULL)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    rc = real(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        ts->tv_sec += shift_seconds();
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    if (tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
