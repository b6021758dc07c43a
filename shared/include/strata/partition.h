/* Partitioners: split a labelled data set over federated clients.
 *
 * A partition assigns every sample index 0..n-1 of a data set to exactly one
 * of num_clients clients, and every client receives at least one sample.
 * Partitions are built from the labels alone and are reproducible: the same
 * labels, spec, client count and seed give the same partition on every
 * platform with the same floating-point behaviour (the Dirichlet scheme uses
 * log and exp). Schemes (the spec string):
 *
 *   "iid"            A uniformly random permutation cut into num_clients
 *                    consecutive pieces; the first n % num_clients clients get
 *                    one sample more than the others.
 *   "dirichlet:A"    Label skew with concentration A > 0: for every class k
 *                    independently, client proportions p ~ Dir(A, ..., A) are
 *                    drawn (normalised Gamma(A) variates), the class's samples
 *                    are shuffled and cut at the cumulative proportions
 *                    (boundary floor(n_k * (p_0 + ... + p_c))). Small A gives
 *                    few classes per client, large A approaches iid. A client
 *                    left without samples is then repaired, in client order:
 *                    it receives one uniformly chosen sample of the client
 *                    that is largest at that moment (lowest id on ties), so
 *                    every client ends with at least one sample and the
 *                    class proportions barely change.
 *   "shards:S"       The FedAvg paper's pathological split: samples are
 *                    sorted by label (ties by ascending index), the sorted
 *                    sequence is cut into T = num_clients * S contiguous
 *                    shards, and each client receives exactly S distinct
 *                    shards chosen uniformly at random. Shard j covers sorted
 *                    positions [j*q + min(j, r), (j+1)*q + min(j+1, r)) with
 *                    q = n / T and r = n % T, so the first r shards hold one
 *                    sample more and no sample is dropped.
 *
 * A strata_partition is a heap object owned by the caller; it is immutable
 * after creation and may be read from several threads at once. */
#ifndef STRATA_PARTITION_H
#define STRATA_PARTITION_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Most classes a partitioner accepts (labels are uint8). */
#define STRATA_PARTITION_MAX_CLASSES 256

typedef struct strata_partition {
    size_t num_clients;
    size_t *counts;   /* counts[c]: samples of client c, always >= 1 */
    size_t **indices; /* indices[c][i]: sample index, strictly ascending in i */
} strata_partition;

/* Splits the n samples whose labels (borrowed, n values, each below
 * num_classes) are given over num_clients clients according to spec (see
 * above), drawing randomness from strata_rng seeded with seed. On success
 * *out receives a new partition to release with strata_partition_free(); on
 * error *out is NULL.
 *
 * Errors: STRATA_EINVAL, with a message naming the problem, for a NULL
 * argument, n == 0, num_classes outside 1..STRATA_PARTITION_MAX_CLASSES, a
 * label >= num_classes, num_clients == 0, more clients than samples, an
 * unknown scheme, a Dirichlet concentration that is not a finite number > 0,
 * a shard count S < 1 or not an integer, or more shards (num_clients * S)
 * than samples; STRATA_ENOMEM. */
int strata_partition_new(const uint8_t *labels, size_t n, int num_classes, const char *spec,
                         size_t num_clients, uint64_t seed, strata_partition **out,
                         strata_diag *diag);

/* Frees a partition and everything it owns. Accepts NULL. */
void strata_partition_free(strata_partition *p);

/* Fills histogram (caller-allocated, num_clients * num_classes values,
 * overwritten) so that histogram[c * num_classes + k] is the number of
 * samples of class k held by client c. labels (borrowed) must be the array
 * the partition was built from; labels >= num_classes are not counted. Does
 * nothing when num_classes < 1. */
void strata_partition_histogram(const strata_partition *p, const uint8_t *labels, int num_classes,
                                size_t *histogram);

/* Prints a table to f: one row per client with its sample count, the number
 * of samples of every class, and the fraction held by its most common class;
 * then a line with the mean of that fraction over clients. Does nothing when
 * an argument is NULL or num_classes is outside
 * 1..STRATA_PARTITION_MAX_CLASSES. */
void strata_partition_print(const strata_partition *p, const uint8_t *labels, int num_classes,
                            FILE *f);

#endif
