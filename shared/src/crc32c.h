/* Internal: the portable CRC32C, exposed so that tests can compare it with
 * the hardware path that strata_crc32c (strata/payload.h) prefers. */
#ifndef STRATA_CRC32C_INTERNAL_H
#define STRATA_CRC32C_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Same contract as strata_crc32c, always computed with the lookup table. */
uint32_t strata__crc32c_sw(uint32_t crc, const void *data, size_t len);

#endif
