/* Clocks and deadlines. Durations and deadlines use the monotonic clock
 * (never steps back when the wall clock is set); timestamps that leave the
 * process (logs, stored rows, the API) use Unix time. Thread-safe. */
#ifndef STRATA_CLOCK_H
#define STRATA_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic time in milliseconds and in seconds (arbitrary origin). */
int64_t strata_clock_mono_ms(void);
double strata_clock_mono_s(void);

/* Wall-clock time in Unix milliseconds. */
int64_t strata_clock_unix_ms(void);

/* The CLOCK_REALTIME instant ms milliseconds from now, as the absolute
 * time that pthread_cond_timedwait takes (ms >= 0). */
struct timespec strata_clock_abstime_in(int64_t ms);

/* A point in monotonic time after which work should stop. */
typedef struct strata_deadline {
    int64_t at_ms; /* monotonic ms; INT64_MAX: never */
} strata_deadline;

/* A deadline ms milliseconds from now; ms < 0 gives one that never expires. */
strata_deadline strata_deadline_in(int64_t ms);

/* 1 when the deadline has passed, else 0. */
int strata_deadline_expired(strata_deadline d);

/* Milliseconds left (0 once expired; INT64_MAX for a deadline that never
 * expires). */
int64_t strata_deadline_left_ms(strata_deadline d);

#endif
