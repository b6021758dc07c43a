/* Stop requests for executables: SIGINT and SIGTERM set one flag that
 * long-running loops poll (and the HTTP transport's waits watch), and
 * SIGPIPE is ignored so that a peer closing a socket is an error return
 * rather than the end of the process. The flag is the process's one piece of
 * signal state, by the nature of signal handlers. */
#ifndef STRATA_STOP_H
#define STRATA_STOP_H

#include <signal.h>

/* Installs the handlers (again harmlessly) and returns the flag: 0 until
 * SIGINT or SIGTERM arrives, then 1. Never NULL. Call it from the main
 * thread before starting others. */
volatile sig_atomic_t *strata_stop_install(void);

#endif
