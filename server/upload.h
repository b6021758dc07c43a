/* The upload pipeline's internals (upload.c). Its public call,
 * srv_engine_upload, is declared in engine.h.
 *
 * upload.c owns: decoding an update once, validating it once against the
 * open round's task, preparing its durable file (write + fsync) outside the
 * lock, the group commit on the second store connection, and the one
 * accept step (aggregate, mark reported, count) that both a batch and a
 * lone upload go through. It may call the store, aggregate.h, metrics.h,
 * registry.h (sorted ids), libstrata (payload) and jansson (receipts). */
#ifndef STRATA_SERVER_UPLOAD_H
#define STRATA_SERVER_UPLOAD_H

/* Most uploads committed in one transaction. */
#define SRV_BATCH_MAX 256

#endif
