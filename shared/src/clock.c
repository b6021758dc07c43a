/* Clocks and deadlines (see strata/clock.h). */
#include "strata/clock.h"

#include <time.h>

static int64_t ms_of(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t strata_clock_mono_ms(void)
{
    return ms_of(CLOCK_MONOTONIC);
}

double strata_clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t strata_clock_unix_ms(void)
{
    return ms_of(CLOCK_REALTIME);
}

struct timespec strata_clock_abstime_in(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

strata_deadline strata_deadline_in(int64_t ms)
{
    strata_deadline d = {INT64_MAX};
    if (ms < 0)
        return d;
    int64_t now = strata_clock_mono_ms();
    d.at_ms = ms > INT64_MAX - now ? INT64_MAX : now + ms;
    return d;
}

int strata_deadline_expired(strata_deadline d)
{
    return d.at_ms != INT64_MAX && strata_clock_mono_ms() >= d.at_ms;
}

int64_t strata_deadline_left_ms(strata_deadline d)
{
    if (d.at_ms == INT64_MAX)
        return INT64_MAX;
    int64_t left = d.at_ms - strata_clock_mono_ms();
    return left > 0 ? left : 0;
}
