/* A small, explicit, seedable random number generator (xoshiro256**
 * seeded through splitmix64). Every consumer owns its own strata_rng; there
 * is no global generator. The same seed gives the same stream on every
 * platform. Not thread-safe: one generator per thread. */
#ifndef STRATA_RNG_H
#define STRATA_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct strata_rng {
    uint64_t s[4];
} strata_rng;

/* Seeds the generator; stream is an extra value that derives independent
 * streams from one seed (e.g. one per client or per thread). */
/* The splitmix64 finaliser: a fixed bijective mix of the 64 bits of x, for
 * hashing an index or a seed into well-spread bits. Pure, thread-safe. */
uint64_t strata_mix64(uint64_t x);

void strata_rng_seed(strata_rng *r, uint64_t seed, uint64_t stream);

uint64_t strata_rng_u64(strata_rng *r);

/* Uniform double in [0, 1). */
double strata_rng_uniform(strata_rng *r);

/* Uniform integer in [0, n) without modulo bias; n must be > 0. */
uint64_t strata_rng_below(strata_rng *r, uint64_t n);

/* Standard normal variate. */
double strata_rng_normal(strata_rng *r);

/* Gamma(shape, 1) variate for shape > 0 (Marsaglia–Tsang). */
double strata_rng_gamma(strata_rng *r, double shape);

/* Shuffles n indices in place (Fisher–Yates). */
void strata_rng_shuffle(strata_rng *r, size_t *idx, size_t n);

#endif
